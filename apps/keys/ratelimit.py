"""Rate limits, concurrency and token quotas: the rules a request must pass, and the answer.

Every rule of a request (the tenant's plan and the key's own limits, per-minute buckets,
concurrency slots, period quotas and, for signed requests, the replay nonce) is checked and
reserved by one Lua script, so limits hold across any number of gateway replicas and a request
is either admitted with all its reservations or with none. Settling gives back what the
reservation overestimated, frees the concurrency slot and appends the usage event, again in one
script, so usage can never be recorded without the limits being settled or the other way round.
apps/keys/limiter.py runs the scripts (and the leases that let a busy key skip most admissions).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from apps.billing.counters import balance_key, period_bounds, period_ttl_ms, spend_key
from apps.keys.keycache import KeyRecord, Limits
from apps.keys.signing import REPLAY_TTL_SECONDS
from dmxplatform.redis_client import tenant_rkey

MINUTE_MS = 60_000
# A concurrency slot whose request never settled (a gateway died) is freed after this long.
SLOT_LEASE_MS = 15 * MINUTE_MS


class Meter:
    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENCY = "concurrency"
    QUOTA = "quota"
    NONCE = "nonce"
    BUDGET = "budget"
    BALANCE = "balance"
    ALL = (REQUESTS, TOKENS, CONCURRENCY, QUOTA, NONCE, BUDGET, BALANCE)
    # Rules that reserve money: a rule set with one is never leased (admit.lua).
    MONEY = frozenset((BUDGET, BALANCE))


@dataclass(frozen=True, slots=True)
class Rule:
    """One limit a request must pass; it costs the request's tokens (token buckets and
    quotas), its money (budgets and prepaid balances, micro-units), one (request buckets and
    concurrency slots) or nothing (nonces)."""

    meter: str
    key: str
    kind: str  # admit.lua's kind
    limit: float
    param: float
    # What a refusal names: a budget's period ("day", "week", "month") and owner ("tenant",
    # "key"), and whether it is soft (counts, never refuses).
    period: str = ""
    scope: str = ""

    @property
    def settle_kind(self) -> str:
        # Token buckets are refunded, request buckets are not; budgets get money back (see
        # settle.lua).
        if self.kind == "r" and self.meter == Meter.TOKENS:
            return "rt"
        if self.meter == Meter.BUDGET:
            return "qm"
        return self.kind


# How long settle.lua keeps a settled request's marker (Once): longer than any try of a batch
# line can come, within its batch's 24-hour window and a lost worker's hold after it.
ONCE_MARKER_MS = 25 * 60 * MINUTE_MS


@dataclass(frozen=True, slots=True)
class Once:
    """The marker of a request that may run again under its id (a batch line whose worker was
    lost): the first try to settle is counted, a later one gives back all it reserved."""

    key: str
    tokens: int  # what the try reserved
    money: int

    @classmethod
    def of(cls, tenant_id: int, request_id: str, tokens: int, money: int) -> Once:
        return cls(tenant_rkey(tenant_id, "settled", request_id), tokens, money)

    def row(self) -> list:
        return ["o", self.tokens, self.money, ONCE_MARKER_MS]


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    rules: tuple[Rule, ...]
    failed: Rule | None = None
    retry_after_ms: int = 0  # -1: the request can never fit (larger than a limit)
    remaining: tuple[tuple[int, int], ...] = ()  # per rule: remaining, ms until full
    member: str = ""  # the concurrency slot it holds: the request's id or a lease's slot

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


def _minute_rules(tenant_id: int, scope: str, owner: int, limits: Limits) -> list[Rule]:
    rules = []
    if limits.requests_per_minute:
        rpm = limits.requests_per_minute
        rules.append(
            Rule(
                Meter.REQUESTS,
                tenant_rkey(tenant_id, "rl", scope, owner, "rpm"),
                "r",
                rpm,
                rpm / MINUTE_MS,
            )
        )
    if limits.tokens_per_minute:
        tpm = limits.tokens_per_minute
        rules.append(
            Rule(
                Meter.TOKENS,
                tenant_rkey(tenant_id, "rl", scope, owner, "tpm"),
                "r",
                tpm,
                tpm / MINUTE_MS,
            )
        )
    if limits.max_concurrent_requests:
        rules.append(
            Rule(
                Meter.CONCURRENCY,
                tenant_rkey(tenant_id, "rl", scope, owner, "conc"),
                "c",
                limits.max_concurrent_requests,
                SLOT_LEASE_MS,
            )
        )
    return rules


def quota_key(tenant_id: int, scope: str, owner: int, label: str, model: str) -> str:
    """The counter of a tenant's or a key's (`scope`, `owner`) quota for the period `label`."""
    return tenant_rkey(tenant_id, "quota", scope, owner, label, model or "*")


def _build_rules(key: KeyRecord, model: str, moment: datetime) -> tuple[Rule, ...]:
    # Every key carries the tenant's hash tag: one script touches them all (a cluster slot).
    rules = _minute_rules(key.tenant_id, "t", key.tenant_id, key.tenant_limits)
    rules += _minute_rules(key.tenant_id, "k", key.id, key.key_limits)
    for quota in key.quotas:
        if quota.model and quota.model != model:
            continue
        label, _, end = period_bounds(quota.period, moment)
        owner = key.tenant_id if quota.scope == "tenant" else key.id
        ttl_ms = period_ttl_ms(end, moment)
        rules.append(
            Rule(
                Meter.QUOTA,
                quota_key(key.tenant_id, quota.scope, owner, label, quota.model),
                "q",
                quota.tokens,
                ttl_ms,
            )
        )
    for budget in key.budgets:
        label, _, end = period_bounds(budget.period, moment)
        rules.append(
            Rule(
                Meter.BUDGET,
                spend_key(key.tenant_id, budget.id, label),
                "q",
                budget.micros if budget.hard else -1,
                period_ttl_ms(end, moment),
                period=budget.period,
                scope=budget.scope,
            )
        )
    if key.prepaid:
        rules.append(Rule(Meter.BALANCE, balance_key(key.tenant_id), "b", 0, 0))
    return tuple(rules)


def rules_for(
    key: KeyRecord, *, model: str, nonce: str | None = None, now: float | None = None
) -> tuple[Rule, ...]:
    """Every rule a request for `model` must pass.

    They change only with the key record, the model and the hour (quota periods roll over on
    hour boundaries at the finest), so they are built once per key, model and hour and kept
    on the cached key record; only a signed request's nonce is added per request.
    """
    moment = time.time() if now is None else now
    cache_key = (model, int(moment // 3600))
    rules = key.rule_cache.get(cache_key)
    if rules is None:
        rules = _build_rules(key, model, datetime.fromtimestamp(moment, tz=UTC))
        key.rule_cache.clear()  # an old hour's rules are no use any more
        key.rule_cache[cache_key] = rules
    if nonce is not None:
        rules = (
            *rules,
            Rule(
                Meter.NONCE,
                tenant_rkey(key.tenant_id, "nonce", key.key_id, nonce),
                "n",
                0,
                REPLAY_TTL_SECONDS * 1000,
            ),
        )
    return rules
