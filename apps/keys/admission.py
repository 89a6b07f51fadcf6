"""Admit a request against its key's limits and quotas, or refuse it with OpenAI's 429s."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from django.conf import settings

from apps.billing.choices import PERIOD_ADJECTIVES
from apps.billing.errors import BillingErrorCode
from apps.billing.money import from_micros
from apps.keys.errors import KeysErrorCode
from apps.keys.keycache import KeyRecord
from apps.keys.limiter import Limiter
from apps.keys.ratelimit import Admission, Meter, rules_for
from dmxplatform import metrics
from dmxplatform.errors import (
    ApplicationError,
    AuthenticationError,
    RateLimitError,
    ServiceUnavailableError,
)
from dmxplatform.resp import RedisUnavailable

# Retry-After for a request that can never fit a per-minute limit: the window's length.
NEVER_FITS_RETRY_SECONDS = 60
# admit.lua's retry for a prepaid balance Redis does not hold.
BALANCE_NOT_HELD = -2


# Each key limit's refusals are in /metrics from the start, so that rate() and alerts see the
# first one (the gateway's and routing's own reasons are set where they are counted).
for _meter in Meter.ALL:
    metrics.gateway_refusals.labels(_meter)


def _money_refusal(admission: Admission, money: int) -> ApplicationError:
    rule = admission.failed
    currency = settings.DMX_CURRENCY
    cost = f"{from_micros(money)} {currency}"
    if rule.meter == Meter.BALANCE:
        return RateLimitError(
            f"Your prepaid balance does not cover this request (it may cost up to {cost}). "
            "Top up or redeem a code to go on.",
            code=BillingErrorCode.BALANCE_TOO_LOW,
            error_type="insufficient_quota",
            # Every 429 says when to try again; a balance comes back with a top-up, any time.
            headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
        )
    owner = "this key's" if rule.scope == "key" else "your"
    budget = f"{PERIOD_ADJECTIVES.get(rule.period, rule.period)} budget"
    if admission.retry_after_ms < 0:
        return RateLimitError(
            f"This request may cost up to {cost}, more than {owner} whole {budget} of "
            f"{from_micros(int(rule.limit))} {currency}: lower max_tokens or the prompt.",
            code=BillingErrorCode.BUDGET_EXCEEDED,
            headers={"Retry-After": str(NEVER_FITS_RETRY_SECONDS)},
            error_type="insufficient_quota",
        )
    retry = max(1, math.ceil(admission.retry_after_ms / 1000))
    return RateLimitError(
        f"You reached {owner} {budget} of {from_micros(int(rule.limit))} {currency}: this "
        f"request may cost up to {cost}. The budget resets in {retry} s.",
        code=BillingErrorCode.BUDGET_EXCEEDED,
        headers={"Retry-After": str(retry)},
        error_type="insufficient_quota",
    )


def _refusal(admission: Admission, reserve: int, money: int) -> ApplicationError:
    rule = admission.failed
    if rule.meter in Meter.MONEY:
        return _money_refusal(admission, money)
    never = admission.retry_after_ms < 0
    retry = (
        NEVER_FITS_RETRY_SECONDS if never else max(1, math.ceil(admission.retry_after_ms / 1000))
    )
    headers = {"Retry-After": str(retry)}
    limit = int(rule.limit)
    if rule.meter == Meter.NONCE:
        return AuthenticationError(
            "This signed request was already received; sign each request anew.",
            code=KeysErrorCode.SIGNATURE_REPLAYED,
        )
    if rule.meter == Meter.QUOTA:
        return RateLimitError(
            f"You exceeded your token quota ({limit} tokens for the period; this request needs "
            f"up to {reserve}). It renews in {retry} s; check your plan.",
            code=KeysErrorCode.INSUFFICIENT_QUOTA,
            headers=headers,
            error_type="insufficient_quota",
        )
    if rule.meter == Meter.CONCURRENCY:
        message = f"Too many concurrent requests (limit {limit}). Please retry shortly."
        error_type = "requests"
    elif rule.meter == Meter.TOKENS:
        message = (
            f"Request too large: it needs up to {reserve} tokens, over the limit of {limit} "
            "tokens per minute. Lower max_tokens or the prompt."
            if never
            else f"Rate limit reached for tokens per minute (limit {limit}). "
            f"Please try again in {retry} s."
        )
        error_type = "tokens"
    else:
        message = (
            f"Rate limit reached for requests per minute (limit {limit}). "
            f"Please try again in {retry} s."
        )
        error_type = "requests"
    return RateLimitError(
        message, code=KeysErrorCode.RATE_LIMIT_EXCEEDED, headers=headers, error_type=error_type
    )


async def admit(
    limiter: Limiter,
    *,
    request_id: str,
    key: KeyRecord,
    model: str,
    reserve: int,
    money: int,
    nonce: str | None,
    seed: Callable[[int], Awaitable[int]],
) -> Admission:
    """Check and reserve `reserve` tokens and `money` micro-units in one Redis round trip;
    raise the right refusal. A prepaid balance Redis does not hold yet is seeded from the
    database (`seed`) and the admission asked again, once."""
    rules = rules_for(key, model=model, nonce=nonce)
    try:
        admission = await limiter.admit(request_id, rules, tokens=reserve, money=money)
        if not admission.admitted and admission.retry_after_ms == BALANCE_NOT_HELD:
            await seed(key.tenant_id)
            admission = await limiter.admit(request_id, rules, tokens=reserve, money=money)
    except RedisUnavailable as exc:
        # Without Redis no limit can be enforced anywhere: refuse rather than serve unmetered.
        raise ServiceUnavailableError(
            "Rate limits cannot be checked right now. Please retry shortly.",
            code=KeysErrorCode.LIMITS_UNAVAILABLE,
            headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
        ) from exc
    if not admission.admitted:
        metrics.gateway_refusals.labels(admission.failed.meter).inc()
        raise _refusal(admission, reserve, money)
    return admission
