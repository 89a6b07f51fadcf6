"""Writes for API keys: create, edit, rotate, signing, revoke; each change pushed to gateways."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.keys.keycache import KeyRecord, invalidation_channel, invalidation_message, record_key
from apps.keys.models import KEY_PREFIX, ApiKey, Tenant
from apps.keys.selectors.api_keys import key_record_load
from apps.keys.signing import signing_secret_issue
from dmxplatform import credentials
from dmxplatform.redis_client import sync_redis

# A rotated key's old secret stays valid at most this long: a day is enough to roll a secret out
# to every client, and short enough that a leaked one dies soon.
MAX_ROTATION_GRACE = timedelta(hours=24)
LIMIT_NAMES = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")


def _check_key_allowed(tenant: Tenant) -> None:
    if not tenant.is_approved:
        raise ValidationError(
            "This account is waiting for an operator's approval; keys can be created once it "
            "is approved."
        )
    if not tenant.is_active:
        raise ValidationError("This tenant is suspended.")


def _check_within_plan(key: ApiKey) -> None:
    """A key's own limits may be tighter than its plan's, never looser (both are enforced; a
    looser one would only mislead)."""
    plan = key.tenant.plan
    if plan is None:
        return
    errors = {}
    for name in LIMIT_NAMES:
        mine, cap = getattr(key, name), getattr(plan, name)
        if cap is not None and mine is not None and mine > cap:
            errors[name] = f"At most {cap}, the plan's limit."
    if errors:
        raise ValidationError(errors)


def api_key_publish(key: ApiKey) -> None:
    """Write a key's record to Redis and tell every gateway, once the transaction commits.

    The record is read afresh, not built from the caller's instance: its tenant may carry
    related rows cached before a change (a billing account made since, budgets set since)."""
    record = key_record_load(key.key_id)
    if record is not None:
        key_records_publish([record])


def key_records_publish(records: list[KeyRecord]) -> None:
    """Write records to Redis and tell every gateway, in one round trip, once the transaction
    commits."""
    if not records:
        return

    def publish() -> None:
        pipe = sync_redis().pipeline(transaction=False)
        for record in records:
            pipe.set(record_key(record.key_id), record.encode())
            pipe.publish(invalidation_channel(), invalidation_message(record.key_id))
        pipe.execute()

    transaction.on_commit(publish)


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    allowed_models: list[str] | None = None,
    allowed_networks: list[str] | None = None,
    expires_at: datetime | None = None,
    **limits,
) -> tuple[ApiKey, str]:
    """Create a key; return it and its plaintext, which is never stored nor shown again.

    `limits`: priority, requests_per_minute, tokens_per_minute, max_concurrent_requests,
    token_quota, token_quota_period (see ApiKey).
    """
    _check_key_allowed(tenant)
    issued = credentials.issue(KEY_PREFIX)
    key = ApiKey(
        tenant=tenant,
        name=name,
        created_by=created_by,
        key_id=issued.credential_id,
        secret_hash=issued.secret_hash,
        allowed_models=list(allowed_models or []),
        allowed_networks=list(allowed_networks or []),
        expires_at=expires_at,
        **limits,
    )
    key.full_clean()
    _check_within_plan(key)
    key.save()
    api_key_publish(key)
    return key, issued.plaintext


def api_key_update(*, key: ApiKey) -> ApiKey:
    """Save edits made to a key (admin, portal) and push them to every gateway."""
    key.full_clean()
    _check_within_plan(key)
    key.save()
    api_key_publish(key)
    return key


def api_key_rotate(*, key: ApiKey, grace: timedelta) -> tuple[ApiKey, str]:
    """Give a key a new secret; return it and the plaintext, shown once. The old secret keeps
    working for `grace` (0 to 24 h), so clients can switch without an outage; the key's id,
    limits and usage stay."""
    if not timedelta(0) <= grace <= MAX_ROTATION_GRACE:
        raise ValidationError({"grace": "Between 0 and 24 hours."})
    if key.revoked_at is not None:
        raise ValidationError("A revoked key cannot be rotated.")
    issued = credentials.issue(KEY_PREFIX, key.key_id)
    key.previous_secret_hash = key.secret_hash if grace else ""
    key.previous_secret_expires_at = timezone.now() + grace if grace else None
    key.secret_hash = issued.secret_hash
    key.save(update_fields=["secret_hash", "previous_secret_hash", "previous_secret_expires_at"])
    api_key_publish(key)
    return key, issued.plaintext


def api_key_signing_enable(*, key: ApiKey) -> str:
    """Require signed requests from a key; return its new signing secret, shown once."""
    secret, encrypted = signing_secret_issue()
    key.signing_required = True
    key.signing_secret_encrypted = encrypted
    key.save(update_fields=["signing_required", "signing_secret_encrypted"])
    api_key_publish(key)
    return secret


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key; every gateway refuses it within a second."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    api_key_publish(key)
    return key
