"""Flat dataclasses that travel through Redis (hashes, streams) as JSON."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Self, TypeVar

import msgspec
import orjson

T = TypeVar("T")


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


def _builtins(value: Any) -> Any:
    """What orjson cannot serialise itself: the node protocol's messages (msgspec Structs)
    that a record holds, such as a node snapshot's engine load."""
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class JsonRecord:
    """encode()/decode() for a dataclass whose fields are all JSON values.

    orjson serialises dataclasses natively, and fast. Empty __slots__ keeps the subclasses'
    slots=True meaningful.
    """

    __slots__ = ()

    def encode(self) -> bytes:
        return orjson.dumps(self, default=_builtins)

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        return from_fields(cls, orjson.loads(raw))


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    if issubclass(cls, msgspec.Struct):
        return frozenset(cls.__struct_fields__)
    return frozenset(f.name for f in dataclasses.fields(cls))


def from_fields(cls: type[T], data: dict[str, Any]) -> T:
    """The dataclass (or msgspec Struct) of these values, ignoring keys it has no field for: in
    a rolling update newer processes write fields older ones do not know yet, and an older
    gateway that refused such a node snapshot would route to no node at all. A missing required
    field still raises TypeError."""
    try:
        return cls(**data)
    except TypeError:
        names = _field_names(cls)
        return cls(**{key: value for key, value in data.items() if key in names})
