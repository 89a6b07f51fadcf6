"""Writes for a tenant's members and the invitations that bring them in."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from apps.keys.choices import MemberRole
from apps.keys.models import Invitation, Membership, Tenant
from dmxplatform import credentials

INVITATION_LIFETIME = timedelta(days=7)


def member_invite(
    *,
    tenant: Tenant,
    email: str,
    role: str,
    invited_by,
    accept_url: Callable[[str], str],
) -> Invitation:
    """Invite someone by email into a tenant; the mail carries the only copy of the token."""
    email = email.strip()
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise ValidationError({"email": "Already a member."})
    token = secrets.token_urlsafe(24)
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=credentials.hash_secret(token),
        invited_by=invited_by,
        expires_at=timezone.now() + INVITATION_LIFETIME,
    )
    invitation.full_clean()
    invitation.save()
    inviter = getattr(invited_by, "email", "") or "An owner"
    send_mail(
        subject=f"You are invited to {tenant.name} on DMX",
        message=(
            f"{inviter} invited you to join {tenant.name} as {invitation.get_role_display()}.\n\n"
            f"Accept within {INVITATION_LIFETIME.days} days: {accept_url(token)}\n"
        ),
        from_email=None,
        recipient_list=[email],
    )
    return invitation


def invitation_withdraw(*, invitation: Invitation) -> None:
    """Withdraw an open invitation: its token no longer lets anyone in."""
    if invitation.accepted_at is not None:
        raise ValidationError("This invitation was accepted already.")
    invitation.delete()


@transaction.atomic
def invitation_accept(*, token: str, user) -> Membership:
    """Join the tenant an invitation names; the user's verified address must be the invited one."""
    from allauth.account.models import EmailAddress

    invitation = (
        Invitation.objects.select_for_update()
        .filter(token_hash=credentials.hash_secret(token))
        .first()
    )
    if invitation is None or invitation.accepted_at is not None:
        raise ValidationError("This invitation is not valid (or was used already).")
    if invitation.expires_at <= timezone.now():
        raise ValidationError("This invitation has expired; ask for a new one.")
    if not EmailAddress.objects.filter(
        user=user, email__iexact=invitation.email, verified=True
    ).exists():
        raise ValidationError(f"This invitation is for {invitation.email}; sign in with it.")
    membership, _ = Membership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role}
    )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


def _check_an_owner_stays(membership: Membership) -> None:
    others = Membership.objects.filter(tenant_id=membership.tenant_id, role=MemberRole.OWNER)
    if membership.is_owner and not others.exclude(id=membership.id).exists():
        raise ValidationError("A tenant keeps at least one owner.")


def member_role_change(*, membership: Membership, role: str) -> Membership:
    if role != MemberRole.OWNER:
        _check_an_owner_stays(membership)
    membership.role = role
    membership.full_clean()
    membership.save(update_fields=["role"])
    return membership


def member_remove(*, membership: Membership) -> None:
    _check_an_owner_stays(membership)
    membership.delete()
