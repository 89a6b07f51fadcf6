"""Reads of memberships, members, invitations and management tokens."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from apps.keys.models import Invitation, ManagementToken, Membership, Tenant
from dmxplatform import credentials


def memberships_of(*, user) -> QuerySet[Membership]:
    """The tenants a user belongs to, with their role, oldest first."""
    return Membership.objects.filter(user=user, tenant__is_active=True).select_related(
        "tenant__plan"
    )


# The portal keeps the tenant a user works in under this session key; the management API reads
# it for calls made with the session.
SESSION_TENANT = "dmx_tenant_id"


def membership_find(*, user, tenant_id: int | None) -> Membership | None:
    """The user's membership of `tenant_id`, or of their first tenant when it is None or not
    theirs: the tenant the portal and the session-authenticated API act in."""
    memberships = memberships_of(user=user).order_by("created_at")
    chosen = memberships.filter(tenant_id=tenant_id).first() if tenant_id else None
    return chosen or memberships.first()


def tenant_members(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("created_at")


def tenant_invitations_open(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        tenant=tenant, accepted_at__isnull=True, expires_at__gt=timezone.now()
    )


def invitation_find(*, token: str) -> Invitation | None:
    """The invitation a token from an invitation mail names, used or not; None if unknown."""
    return (
        Invitation.objects.select_related("tenant")
        .filter(token_hash=credentials.hash_secret(token))
        .first()
    )


def management_tokens_of(*, user, tenant: Tenant) -> QuerySet[ManagementToken]:
    return ManagementToken.objects.filter(user=user, tenant=tenant)
