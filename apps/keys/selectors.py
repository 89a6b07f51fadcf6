"""Reads of keys and usage."""

from __future__ import annotations

from apps.keys.keycache import KeyRecord
from apps.keys.models import ApiKey


def key_record_from_row(key: ApiKey) -> KeyRecord:
    return KeyRecord(
        id=key.id,
        key_id=key.key_id,
        secret_hash=key.secret_hash,
        tenant_id=key.tenant_id,
        name=key.name,
        allowed_models=tuple(key.allowed_models or ()),
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        revoked=key.revoked_at is not None or not key.tenant.is_active,
    )


def key_record_load(key_id: str) -> KeyRecord | None:
    """Return a key's record from the database, or None when the id is unknown."""
    key = ApiKey.objects.select_related("tenant").filter(key_id=key_id).first()
    return key_record_from_row(key) if key else None
