"""Budgets: spending limits per period for a tenant or one of its keys."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import transaction

from apps.billing.choices import PERIOD_ADJECTIVES
from apps.billing.errors import BillingErrorCode
from apps.billing.models import Budget
from apps.billing.money import as_text
from apps.billing.signals import tenant_billing_changed
from dmxplatform.errors import PermissionDeniedError


def _republish(tenant_id: int) -> None:
    # The gateways check budgets from the key records: republish them once this commits.
    transaction.on_commit(lambda: tenant_billing_changed.send(sender=Budget, tenant_id=tenant_id))


class BudgetLocked(PermissionDeniedError):
    """An owner tried to change or remove a budget an operator set: a 403 in the API's shape
    wherever it is raised (the management API renders it as it is)."""

    def __init__(self, budget: Budget) -> None:
        super().__init__(
            f"The {PERIOD_ADJECTIVES[budget.period]} budget of {as_text(budget.amount)} "
            f"{settings.DMX_CURRENCY} was set by the platform's operators: ask them to change or "
            "remove it.",
            code=BillingErrorCode.BUDGET_LOCKED,
        )


def budget_set(
    *,
    tenant_id: int,
    period: str,
    amount: Decimal,
    hard: bool = True,
    api_key_id: int | None = None,
    locked: bool | None = None,
) -> Budget:
    """Create or change the tenant's (or a key's) budget for `period`.

    `locked` is the operators' (the admin's): None, an owner's call, may not touch a locked
    budget (BudgetLocked); True or False sets whether owners may."""
    with transaction.atomic():
        budget = (
            Budget.objects.select_for_update()
            .filter(tenant_id=tenant_id, api_key_id=api_key_id, period=period)
            .first()
        ) or Budget(tenant_id=tenant_id, api_key_id=api_key_id, period=period)
        if locked is None and budget.locked:
            raise BudgetLocked(budget)
        budget.amount = amount
        budget.hard = hard
        if locked is not None:
            budget.locked = locked
        budget.full_clean(validate_constraints=False)
        budget.save()
        _republish(tenant_id)
    return budget


def budget_delete(*, budget: Budget, operator: bool = False) -> None:
    """Remove a budget; only an operator removes a locked one."""
    if budget.locked and not operator:
        raise BudgetLocked(budget)
    with transaction.atomic():
        budget.delete()
        _republish(budget.tenant_id)
