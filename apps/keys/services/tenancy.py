"""Writes for tenants (sign-up, approval) and plans; a change pushed to the keys it touches."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from apps.keys.choices import MemberRole, QuotaPeriod
from apps.keys.models import Membership, Plan, PlanQuota, Tenant
from apps.keys.selectors.api_keys import key_records_of_tenants
from apps.keys.services.api_keys import key_records_publish

# The limits of the plan new accounts are put on when it does not exist (it was deleted, or the
# database was emptied): a sign-up must never get an unlimited tenant. Migration keys/0004
# seeds the same plan, so operators can edit it before the first sign-up.
NEW_ACCOUNT_LIMITS = {
    "requests_per_minute": 60,
    "tokens_per_minute": 100_000,
    "max_concurrent_requests": 8,
}
NEW_ACCOUNT_MONTHLY_TOKENS = 1_000_000


def tenant_create(*, name: str, slug: str, plan: Plan | None = None) -> Tenant:
    """Create a tenant, approved: operators create tenants they mean to serve."""
    tenant = Tenant(name=name, slug=slug, plan=plan, approved_at=timezone.now())
    tenant.full_clean()
    tenant.save()
    return tenant


def _free_slug(base: str) -> str:
    base = slugify(base)[:48] or "tenant"
    slug = base
    while Tenant.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


@transaction.atomic
def tenant_sign_up(*, user) -> Tenant:
    """Give a new account a tenant of its own on the default plan, owned by it; approved at once
    unless operators approve new accounts (DMX_ACCOUNT_APPROVAL_REQUIRED)."""
    plan, created = Plan.objects.get_or_create(
        name=settings.DMX_DEFAULT_PLAN,
        defaults={
            "description": "The plan of new accounts (DMX_DEFAULT_PLAN).",
            **NEW_ACCOUNT_LIMITS,
        },
    )
    if created:
        PlanQuota.objects.create(
            plan=plan, period=QuotaPeriod.MONTH, model="", tokens=NEW_ACCOUNT_MONTHLY_TOKENS
        )
    local = (user.email or user.get_username()).partition("@")[0]
    tenant = Tenant(
        name=local or "My tenant",
        slug=_free_slug(local),
        plan=plan,
        approved_at=None if settings.DMX_ACCOUNT_APPROVAL_REQUIRED else timezone.now(),
    )
    tenant.full_clean()
    tenant.save()
    Membership.objects.create(tenant=tenant, user=user, role=MemberRole.OWNER)
    return tenant


def tenant_approve(*, tenant: Tenant) -> Tenant:
    """Let a tenant waiting for approval create keys."""
    if tenant.approved_at is None:
        tenant.approved_at = timezone.now()
        tenant.save(update_fields=["approved_at"])
    return tenant


def tenant_keys_publish(*, tenant_ids: list[int]) -> int:
    """Push the keys of tenants whose plan, status or billing (budgets, prepaid or not)
    changed; return how many."""
    records = key_records_of_tenants(tenant_ids=tenant_ids)
    key_records_publish(records)
    return len(records)


def plan_publish(*, plan: Plan) -> int:
    """Push a changed plan to every gateway through its tenants' keys."""
    return tenant_keys_publish(tenant_ids=list(plan.tenants.values_list("id", flat=True)))


@transaction.atomic
def plan_save(*, plan: Plan, quotas: list[dict] | None = None) -> Plan:
    """Create or change a plan and, when `quotas` (PlanQuota fields) are given, replace its
    quotas with them; push the result to every gateway."""
    plan.full_clean()
    plan.save()
    if quotas is not None:
        plan.quotas.all().delete()
        for number, fields in enumerate(quotas, start=1):
            quota = PlanQuota(plan=plan, **fields)
            try:
                quota.full_clean()
            except ValidationError as exc:
                message = f"Quota {number}: {' '.join(exc.messages)}"
                raise ValidationError({"quotas": message}) from exc
            quota.save()
    plan_publish(plan=plan)
    return plan


@transaction.atomic
def plan_edit(
    *,
    plan: Plan,
    quotas_saved: Sequence[PlanQuota] = (),
    quotas_deleted: Sequence[PlanQuota] = (),
) -> Plan:
    """Create or change a plan with the quotas added, changed or removed one by one (the
    admin's inline: a quota left alone keeps its row); push the result to every gateway."""
    plan.full_clean()
    plan.save()
    for quota in quotas_deleted:
        quota.delete()
    for quota in quotas_saved:
        quota.plan = plan
        quota.full_clean()
        quota.save()
    plan_publish(plan=plan)
    return plan


def plan_delete(*, plan: Plan) -> None:
    """Delete a plan no tenant is on."""
    if plan.tenants.exists():
        raise ValidationError("Tenants are on this plan: move them to another one first.")
    plan.delete()


def tenant_update(*, tenant: Tenant) -> Tenant:
    """Save an operator's tenant, new or changed (its plan, a suspension); push it to its
    keys."""
    tenant.full_clean()
    tenant.save()
    tenant_keys_publish(tenant_ids=[tenant.id])
    return tenant
