"""What the console and the management API read beyond what people see of their own money:
redemption batches and their codes, prices with where each stands, and the tenants, keys and
model versions an operator or an owner names (found through billing's own foreign keys, by
label: billing imports neither keys nor the catalog)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone

from apps.billing.models import BillingAccount, Budget, Price, RedemptionBatch, RedemptionCode


def batches_with_counts(*, with_codes: bool = False) -> QuerySet[RedemptionBatch]:
    """Every batch, newest first, with `redeemed`: how many of its codes were redeemed (and
    its codes, in the order they were made, `with_codes`)."""
    batches = RedemptionBatch.objects.annotate(
        redeemed=Count("codes", filter=Q(codes__redeemed_at__isnull=False))
    )
    if with_codes:
        batches = batches.prefetch_related(
            Prefetch("codes", queryset=RedemptionCode.objects.order_by("id"))
        )
    return batches


def prices_with_standing(*, now: datetime | None = None) -> QuerySet[Price]:
    """Every price with `in_force_from`: the start of its version's price in force now (a
    price is in force when it is that one, scheduled when it starts later, else superseded)."""
    moment = now or timezone.now()
    current = (
        Price.objects.filter(model_version=OuterRef("model_version"), effective_from__lte=moment)
        .order_by("-effective_from")
        .values("effective_from")[:1]
    )
    return Price.objects.select_related("model_version__model").annotate(
        in_force_from=Subquery(current)
    )


def tenant_exists(tenant_id: int) -> bool:
    tenant = BillingAccount._meta.get_field("tenant").related_model
    return tenant.objects.filter(pk=tenant_id).exists()


def model_version_exists(model_version_id: int) -> bool:
    version = Price._meta.get_field("model_version").related_model
    return version.objects.filter(pk=model_version_id).exists()


def api_key_of_tenant(*, tenant_id: int, key_id: str) -> int | None:
    """The id of the tenant's key whose public id is `key_id`; None: no such key of its."""
    key = Budget._meta.get_field("api_key").related_model
    found = key.objects.filter(tenant_id=tenant_id, key_id=key_id)
    return found.values_list("id", flat=True).first()
