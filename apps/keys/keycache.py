"""API keys as the gateway reads them: a record in Redis, cached in each process.

Lookups go process memory -> Redis -> database, and never touch the database on a hit. Services
publish a key's record on every change and announce it on INVALIDATION_CHANNEL; each gateway
drops its copy on the announcement, so a revocation is live everywhere in well under a second.
The TTL bounds staleness should an announcement be missed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import orjson
import redis.asyncio as aioredis

from dmxplatform.redis_client import rkey

INVALIDATION_CHANNEL = ("invalidate",)
# Unknown key ids are remembered this long, so that random keys cannot flood the database.
NEGATIVE_TTL_SECONDS = 30
_MISSING = b"-"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: int
    key_id: str
    secret_hash: str
    tenant_id: int
    name: str
    allowed_models: tuple[str, ...]
    expires_at: float | None
    revoked: bool

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> KeyRecord:
        data = orjson.loads(raw)
        data["allowed_models"] = tuple(data["allowed_models"])
        return cls(**data)


def record_key(key_id: str) -> str:
    return rkey("apikey", key_id)


def invalidation_channel() -> str:
    return rkey(*INVALIDATION_CHANNEL)


def invalidation_message(key_id: str) -> str:
    return f"apikey:{key_id}"


class KeyCache:
    """One gateway process's cache of key records."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        load: Callable[[str], Awaitable[KeyRecord | None]],
        ttl: float,
    ) -> None:
        self._redis = redis
        self._load = load
        self._ttl = ttl
        self._entries: dict[str, tuple[float, KeyRecord | None]] = {}

    async def get(self, key_id: str) -> KeyRecord | None:
        """Return the record for a key id, or None when no such key exists."""
        now = time.monotonic()
        entry = self._entries.get(key_id)
        if entry is not None and entry[0] > now:
            return entry[1]
        raw = await self._redis.get(record_key(key_id))
        if raw == _MISSING:
            record = None
        elif raw is not None:
            record = KeyRecord.decode(raw)
        else:
            record = await self._load(key_id)
            if record is None:
                await self._redis.set(record_key(key_id), _MISSING, ex=NEGATIVE_TTL_SECONDS)
            else:
                await self._redis.set(record_key(key_id), record.encode())
        self._entries[key_id] = (now + self._ttl, record)
        return record

    def invalidate(self, message: str) -> None:
        """Drop what an invalidation message names."""
        kind, _, key_id = message.partition(":")
        if kind == "apikey":
            self._entries.pop(key_id, None)

    def clear(self) -> None:
        self._entries.clear()
