"""Database state every gateway holds a copy of (the model catalog, the routing table, the
content filter), kept fresh without reading the database on each refresh.

A counter in Redis per kind of state says when it changed: the service that changes it bumps
the counter once its transaction commits (`VersionCounter.bump_on_commit`), and each gateway's
refresh compares the counter with the version its copy was built from, rebuilding the copy off
the event loop only when it moved (`reloaded`). A copy is any object with a `version`; one built
before any read has version -1, so the first refresh always builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from channels.db import database_sync_to_async
from django.db import transaction

from dmxplatform.redis_client import rkey, sync_redis


class Versioned(Protocol):
    @property
    def version(self) -> int: ...


V = TypeVar("V", bound=Versioned)


@dataclass(frozen=True)
class VersionCounter:
    name: str

    @property
    def key(self) -> str:
        # Read when used, not when defined: the Redis prefix is a setting.
        return rkey(self.name, "version")

    def bump_on_commit(self) -> None:
        """Tell every gateway to rebuild its copy once the current transaction commits."""
        transaction.on_commit(lambda: sync_redis().incr(self.key))


async def reloaded(copy: V, counter_value: bytes | str | None, load: Callable[[int], V]) -> V:
    """`copy` itself while the counter's value (as Redis returned it; None before any bump) is
    the version it was built from; else a new copy, `load(version)`, in a thread (it reads
    the database)."""
    version = int(counter_value or 0)
    if version == copy.version:
        return copy
    return await database_sync_to_async(load)(version)
