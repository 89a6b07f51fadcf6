"""Reads of keys and usage."""

from __future__ import annotations

from apps.keys.keycache import KeyRecord, Limits, Quota
from apps.keys.models import ApiKey, RateLimits


def _limits(source: RateLimits | None) -> Limits:
    if source is None:
        return Limits()
    return Limits(
        requests_per_minute=source.requests_per_minute,
        tokens_per_minute=source.tokens_per_minute,
        max_concurrent_requests=source.max_concurrent_requests,
    )


def key_record_from_row(key: ApiKey) -> KeyRecord:
    """Flatten a key, its tenant and its tenant's plan into what the gateway checks."""
    plan = key.tenant.plan
    quotas = [
        Quota(scope="tenant", period=q.period, model=q.model, tokens=q.tokens)
        for q in (plan.quotas.all() if plan else ())
    ]
    if key.token_quota:
        quotas.append(
            Quota(scope="key", period=key.token_quota_period, model="", tokens=key.token_quota)
        )
    return KeyRecord(
        id=key.id,
        key_id=key.key_id,
        secret_hash=key.secret_hash,
        tenant_id=key.tenant_id,
        name=key.name,
        allowed_models=tuple(key.allowed_models or ()),
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        revoked=key.revoked_at is not None or not key.tenant.is_active,
        allowed_networks=tuple(key.allowed_networks or ()),
        priority=key.priority,
        signing_secret_encrypted=key.signing_secret_encrypted if key.signing_required else "",
        tenant_limits=_limits(plan),
        key_limits=_limits(key),
        quotas=tuple(quotas),
    )


def key_record_load(key_id: str) -> KeyRecord | None:
    """Return a key's record from the database, or None when the id is unknown."""
    key = (
        ApiKey.objects.select_related("tenant__plan")
        .prefetch_related("tenant__plan__quotas")
        .filter(key_id=key_id)
        .first()
    )
    return key_record_from_row(key) if key else None
