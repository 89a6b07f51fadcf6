"""Budgets: spending limits per period for a tenant or one of its keys."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from apps.billing.models import Budget
from apps.billing.signals import tenant_billing_changed


def _republish(tenant_id: int) -> None:
    # The gateways check budgets from the key records: republish them once this commits.
    transaction.on_commit(lambda: tenant_billing_changed.send(sender=Budget, tenant_id=tenant_id))


def budget_set(
    *,
    tenant_id: int,
    period: str,
    amount: Decimal,
    hard: bool = True,
    api_key_id: int | None = None,
) -> Budget:
    """Create or change the tenant's (or a key's) budget for `period`."""
    with transaction.atomic():
        budget = Budget.objects.filter(
            tenant_id=tenant_id, api_key_id=api_key_id, period=period
        ).first() or Budget(tenant_id=tenant_id, api_key_id=api_key_id, period=period)
        budget.amount = amount
        budget.hard = hard
        budget.full_clean(validate_constraints=False)
        budget.save()
        _republish(tenant_id)
    return budget


def budget_delete(*, budget: Budget) -> None:
    with transaction.atomic():
        budget.delete()
        _republish(budget.tenant_id)
