"""Writes for management tokens, and their authentication."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.keys.models import MANAGEMENT_TOKEN_PREFIX, ManagementToken, Membership, Tenant
from dmxplatform import credentials

# A management token's last use is written at most this often: not a write per API call.
TOKEN_USE_RESOLUTION = timedelta(minutes=1)
MAX_TOKEN_LIFETIME = timedelta(days=366)


def management_token_create(
    *, user, tenant: Tenant, name: str, scope: str, expires_at: datetime
) -> tuple[ManagementToken, str]:
    """Create a management token; return it and its plaintext, shown once."""
    if expires_at <= timezone.now() or expires_at > timezone.now() + MAX_TOKEN_LIFETIME:
        raise ValidationError({"expires_at": "Within the next year."})
    issued = credentials.issue(MANAGEMENT_TOKEN_PREFIX)
    token = ManagementToken(
        user=user,
        tenant=tenant,
        name=name,
        token_id=issued.credential_id,
        secret_hash=issued.secret_hash,
        scope=scope,
        expires_at=expires_at,
    )
    token.full_clean()
    token.save()
    return token, issued.plaintext


def management_token_revoke(*, token: ManagementToken) -> ManagementToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def management_token_update(*, token: ManagementToken) -> ManagementToken:
    """Save an operator's edit of a token (its name, scope, expiry, revocation); every call
    reads the token from the database, so the next one sees it."""
    token.full_clean()
    token.save()
    return token


def management_token_authenticate(*, plaintext: str) -> ManagementToken | None:
    """The live token a credential names, or None: unknown, wrong secret, revoked, expired, or
    its user no longer active or no longer in its tenant."""
    parts = credentials.split(plaintext, MANAGEMENT_TOKEN_PREFIX)
    if parts is None:
        return None
    token = (
        ManagementToken.objects.select_related("user", "tenant").filter(token_id=parts[0]).first()
    )
    now = timezone.now()
    if (
        token is None
        or not credentials.secret_matches(parts[1], token.secret_hash)
        or token.revoked_at is not None
        or token.expires_at <= now
        or not token.user.is_active
        or not Membership.objects.filter(tenant_id=token.tenant_id, user_id=token.user_id).exists()
    ):
        return None
    if token.last_used_at is None or now - token.last_used_at > TOKEN_USE_RESOLUTION:
        ManagementToken.objects.filter(id=token.id).update(last_used_at=now)
    return token
