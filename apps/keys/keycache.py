"""API keys as the gateway reads them: a record in Redis, cached in each process.

Lookups go process memory -> Redis -> database, and never touch the database on a hit. Services
publish a key's record on every change and announce it on INVALIDATION_CHANNEL; each gateway
drops its copy on the announcement, so a revocation is live everywhere in well under a second.
The TTL bounds staleness should an announcement be missed.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from functools import cached_property

import orjson

from dmxplatform.redis_client import rkey
from dmxplatform.resp import RespClient

INVALIDATION_CHANNEL = ("invalidate",)
# Unknown key ids are remembered this long, so that random keys cannot flood the database.
NEGATIVE_TTL_SECONDS = 30
_MISSING = b"-"


@dataclass(frozen=True, slots=True)
class Quota:
    """A token cap per calendar period, for the tenant or the key, all models or one."""

    scope: str  # "tenant" or "key"
    period: str  # QuotaPeriod value
    model: str  # "" for all models
    tokens: int


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """A spending limit per calendar period (apps.billing.Budget), in micro-units."""

    id: int
    scope: str  # "tenant" or "key"
    period: str  # apps.billing.choices.BudgetPeriod value
    micros: int
    hard: bool = True


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-minute limits and concurrency; None is unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None


@dataclass(frozen=True)
class KeyRecord:
    """Everything the gateway checks about a key, flattened so no other lookup is needed."""

    id: int
    key_id: str
    secret_hash: str
    tenant_id: int
    name: str
    allowed_models: tuple[str, ...]
    expires_at: float | None
    revoked: bool
    allowed_networks: tuple[str, ...] = ()
    priority: int = 1
    signing_secret_encrypted: str = ""
    tenant_limits: Limits = field(default_factory=Limits)
    key_limits: Limits = field(default_factory=Limits)
    quotas: tuple[Quota, ...] = ()
    # A rotated key's old secret, accepted until previous_valid_until (epoch seconds).
    previous_secret_hash: str = ""
    previous_valid_until: float | None = None
    # Billing: the plan's name (spend metrics), its price multiplier in ten-thousandths, the
    # tenant's and this key's budgets, and whether requests spend a prepaid balance.
    plan: str = ""
    price_multiplier: int = 10_000
    budgets: tuple[BudgetLimit, ...] = ()
    prepaid: bool = False

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def secret_hashes(self, now: float) -> tuple[str, ...]:
        """The hashes a presented secret may match now: the current one, and the one a rotation
        replaced while its grace period lasts (checked per request, so it ends on time without a
        republish)."""
        if self.previous_secret_hash and now < (self.previous_valid_until or 0):
            return (self.secret_hash, self.previous_secret_hash)
        return (self.secret_hash,)

    # Derived once per cached record, not per request.
    @cached_property
    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)

    @cached_property
    def rule_cache(self) -> dict:
        """The limit rules built for this record (apps.keys.ratelimit.rules_for)."""
        return {}

    @cached_property
    def signing_secret(self) -> bytes | None:
        from apps.keys.signing import signing_secret_decrypt

        return signing_secret_decrypt(self.signing_secret_encrypted)

    def allows_address(self, address: str | None) -> bool:
        if not self.allowed_networks:
            return True
        if address is None:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def encode(self) -> bytes:
        return orjson.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def decode(cls, raw: bytes) -> KeyRecord:
        data = orjson.loads(raw)
        data["allowed_models"] = tuple(data["allowed_models"])
        data["allowed_networks"] = tuple(data.get("allowed_networks", ()))
        data["tenant_limits"] = Limits(**data.get("tenant_limits", {}))
        data["key_limits"] = Limits(**data.get("key_limits", {}))
        data["quotas"] = tuple(Quota(**q) for q in data.get("quotas", ()))
        data["budgets"] = tuple(BudgetLimit(**b) for b in data.get("budgets", ()))
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
        redis: RespClient,
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
        raw = await self._redis.execute(b"GET", record_key(key_id))
        if raw == _MISSING:
            record = None
        elif raw is not None:
            record = KeyRecord.decode(raw)
        else:
            record = await self._load(key_id)
            if record is None:
                await self._redis.execute(
                    b"SET", record_key(key_id), _MISSING, b"EX", NEGATIVE_TTL_SECONDS
                )
            else:
                await self._redis.execute(b"SET", record_key(key_id), record.encode())
        self._entries[key_id] = (now + self._ttl, record)
        return record

    def invalidate(self, message: str) -> None:
        """Drop what an invalidation message names."""
        kind, _, key_id = message.partition(":")
        if kind == "apikey":
            self._entries.pop(key_id, None)

    def clear(self) -> None:
        self._entries.clear()
