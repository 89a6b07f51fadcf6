"""Flat dataclasses that travel through Redis (hashes, streams) as JSON."""

from __future__ import annotations

from typing import Self

import orjson


class JsonRecord:
    """encode()/decode() for a dataclass whose fields are all JSON values.

    orjson serialises dataclasses natively, and fast. Empty __slots__ keeps the subclasses'
    slots=True meaningful.
    """

    __slots__ = ()

    def encode(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        return cls(**orjson.loads(raw))
