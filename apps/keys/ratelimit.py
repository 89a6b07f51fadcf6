"""Rate limits, concurrency and token quotas: one Redis round trip to admit, one to settle.

Every rule of a request (the tenant's plan and the key's own limits, per-minute buckets,
concurrency slots, period quotas and, for signed requests, the replay nonce) is checked and
reserved by one Lua script, so limits hold across any number of gateway replicas and a request
is either admitted with all its reservations or with none. Settling gives back what the
reservation overestimated, frees the concurrency slot and appends the usage event, again in one
script, so usage can never be recorded without the limits being settled or the other way round.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis.asyncio as aioredis

from apps.keys.choices import QuotaPeriod
from apps.keys.keycache import KeyRecord, Limits
from apps.keys.signing import REPLAY_TTL_SECONDS
from dmxplatform.redis_client import rkey

_LUA = Path(__file__).parent / "lua"
MINUTE_MS = 60_000
# A concurrency slot whose request never settled (a gateway died) is freed after this long.
SLOT_LEASE_MS = 15 * MINUTE_MS
# Quota counters outlive their period by a day, so late settlements still find them.
QUOTA_GRACE = timedelta(days=1)


class Meter:
    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENCY = "concurrency"
    QUOTA = "quota"
    NONCE = "nonce"


@dataclass(frozen=True, slots=True)
class Rule:
    meter: str
    key: str
    kind: str  # admit.lua's kind
    limit: float
    cost: float
    param: float

    @property
    def settle_kind(self) -> str:
        # Token buckets are refunded; request buckets are not (see settle.lua).
        return "rt" if self.kind == "r" and self.meter == Meter.TOKENS else self.kind


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    rules: tuple[Rule, ...]
    failed: Rule | None = None
    retry_after_ms: int = 0  # -1: the request can never fit (larger than a limit)
    remaining: tuple[tuple[int, int], ...] = ()  # per rule: remaining, ms until full

    def headers(self) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-* headers for the tightest request and token buckets."""
        out: list[tuple[bytes, bytes]] = []
        for meter in (Meter.REQUESTS, Meter.TOKENS):
            rows = [
                (rule, state)
                for rule, state in zip(self.rules, self.remaining, strict=False)
                if rule.meter == meter and rule.kind == "r"
            ]
            if not rows:
                continue
            rule, (remaining, reset_ms) = min(rows, key=lambda row: row[1][0])
            out += [
                (f"x-ratelimit-limit-{meter}".encode(), str(int(rule.limit)).encode()),
                (f"x-ratelimit-remaining-{meter}".encode(), str(remaining).encode()),
                (f"x-ratelimit-reset-{meter}".encode(), format_duration(reset_ms).encode()),
            ]
        return out


def format_duration(ms: int) -> str:
    """Render a reset time as OpenAI does: 20ms, 1s, 6m0s, 1h2m3s."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = math.ceil(ms / 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def period_bounds(period: str, now: datetime) -> tuple[str, datetime]:
    """Return the label and end of the UTC calendar period containing `now`."""
    if period == QuotaPeriod.HOUR:
        start = now.replace(minute=0, second=0, microsecond=0)
        return start.strftime("%Y%m%d%H"), start + timedelta(hours=1)
    if period == QuotaPeriod.DAY:
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y%m%d"), start + timedelta(days=1)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y%m"), following


def _minute_rules(scope: str, owner: int | str, limits: Limits, tokens: int) -> list[Rule]:
    rules = []
    if limits.requests_per_minute:
        rpm = limits.requests_per_minute
        rules.append(
            Rule(Meter.REQUESTS, rkey("rl", scope, owner, "rpm"), "r", rpm, 1, rpm / MINUTE_MS)
        )
    if limits.tokens_per_minute:
        tpm = limits.tokens_per_minute
        rules.append(
            Rule(Meter.TOKENS, rkey("rl", scope, owner, "tpm"), "r", tpm, tokens, tpm / MINUTE_MS)
        )
    if limits.max_concurrent_requests:
        rules.append(
            Rule(
                Meter.CONCURRENCY,
                rkey("rl", scope, owner, "conc"),
                "c",
                limits.max_concurrent_requests,
                1,
                SLOT_LEASE_MS,
            )
        )
    return rules


def rules_for(
    key: KeyRecord, *, model: str, tokens: int, nonce: str | None = None, now: float | None = None
) -> tuple[Rule, ...]:
    """Every rule a request for `model` reserving `tokens` must pass."""
    rules = _minute_rules("t", key.tenant_id, key.tenant_limits, tokens)
    rules += _minute_rules("k", key.id, key.key_limits, tokens)
    moment = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC)
    for quota in key.quotas:
        if quota.model and quota.model != model:
            continue
        label, end = period_bounds(quota.period, moment)
        owner = key.tenant_id if quota.scope == "tenant" else key.id
        ttl_ms = int((end + QUOTA_GRACE - moment).total_seconds() * 1000)
        rules.append(
            Rule(
                Meter.QUOTA,
                rkey("quota", quota.scope, owner, label, quota.model or "*"),
                "q",
                quota.tokens,
                tokens,
                ttl_ms,
            )
        )
    if nonce is not None:
        rules.append(
            Rule(
                Meter.NONCE, rkey("nonce", key.key_id, nonce), "n", 0, 0, REPLAY_TTL_SECONDS * 1000
            )
        )
    return tuple(rules)


class Limiter:
    """The two scripts, bound to one gateway process's Redis client."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._admit = redis.register_script((_LUA / "admit.lua").read_text())
        self._settle = redis.register_script((_LUA / "settle.lua").read_text())

    async def admit(self, request_id: str, rules: tuple[Rule, ...]) -> Admission:
        if not rules:
            return Admission(admitted=True, rules=rules)
        args: list[str | float] = [request_id]
        for rule in rules:
            args += [rule.kind, rule.limit, rule.cost, rule.param]
        reply = await self._admit(keys=[rule.key for rule in rules], args=args)
        admitted, failed, retry = int(reply[0]), int(reply[1]), int(reply[2])
        if not admitted:
            return Admission(
                admitted=False, rules=rules, failed=rules[failed - 1], retry_after_ms=retry
            )
        states = reply[3:]
        return Admission(
            admitted=True,
            rules=rules,
            remaining=tuple((int(states[i]), int(states[i + 1])) for i in range(0, len(states), 2)),
        )

    async def settle(
        self,
        request_id: str,
        rules: tuple[Rule, ...],
        *,
        refund: int,
        events: list[tuple[str, bytes]],
    ) -> None:
        """Refund the overestimate, free the slot and append the events (durable stream key,
        payload), in one round trip."""
        args: list[str | float | bytes] = [request_id, refund, len(rules)]
        for rule in rules:
            args += [rule.settle_kind, rule.limit, rule.param]
        args += [payload for _, payload in events]
        keys = [*(rule.key for rule in rules), *(stream for stream, _ in events)]
        await self._settle(keys=keys, args=args)
