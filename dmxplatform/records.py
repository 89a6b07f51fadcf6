"""Flat dataclasses that travel through Redis (hashes, streams) as JSON."""

from __future__ import annotations

from typing import Self

import orjson


def storable_text(value: str, limit: int) -> str:
    """Return text a client sent as a database column can hold it: characters that PostgreSQL
    refuses or a reader cannot see (NUL, control and format characters) escaped as \\xNN or
    \\uNNNN, then cut to the column's length."""
    if not value.isprintable():
        value = "".join(
            char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
            for char in value
        )
    return value[:limit]


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
