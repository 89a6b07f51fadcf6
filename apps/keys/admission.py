"""Admit a request against its key's limits and quotas, or refuse it with OpenAI's 429s."""

from __future__ import annotations

import math

from django.conf import settings

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


# Each key limit's refusals are in /metrics from the start, so that rate() and alerts see the
# first one (the gateway's and routing's own reasons are set where they are counted).
for _meter in Meter.ALL:
    metrics.gateway_refusals.labels(_meter)


def _refusal(admission: Admission, reserve: int) -> ApplicationError:
    rule = admission.failed
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
    nonce: str | None,
) -> Admission:
    """Check and reserve in one Redis round trip; raise the right refusal."""
    rules = rules_for(key, model=model, nonce=nonce)
    try:
        admission = await limiter.admit(request_id, rules, tokens=reserve)
    except RedisUnavailable as exc:
        # Without Redis no limit can be enforced anywhere: refuse rather than serve unmetered.
        raise ServiceUnavailableError(
            "Rate limits cannot be checked right now. Please retry shortly.",
            code=KeysErrorCode.LIMITS_UNAVAILABLE,
            headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
        ) from exc
    if not admission.admitted:
        metrics.gateway_refusals.labels(admission.failed.meter).inc()
        raise _refusal(admission, reserve)
    return admission
