"""A tenant's money as people see it: its account and movements, its budgets and their spend."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from apps.billing.counters import period_bounds, refused_key, spend_key
from apps.billing.models import BalanceMovement, BillingAccount, Budget
from apps.billing.money import from_micros
from dmxplatform.redis_client import request_mget


def account_find(tenant_id: int) -> BillingAccount | None:
    return BillingAccount.objects.filter(tenant_id=tenant_id).first()


def movements_of(tenant_id: int) -> QuerySet[BalanceMovement]:
    return BalanceMovement.objects.filter(account__tenant_id=tenant_id)


def budgets_of(tenant_id: int) -> QuerySet[Budget]:
    return Budget.objects.filter(tenant_id=tenant_id).select_related("api_key")


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    budget: Budget
    spent: Decimal  # this period, requests in flight counted at what they may cost
    starts_at: datetime
    resets_at: datetime
    # A hard budget turned a request away this period: reached for the alert, though a hard
    # budget refuses before it is spent to the last unit.
    refused: bool = False

    @property
    def ratio(self) -> float:
        return float(self.spent / self.budget.amount) if self.budget.amount else 1.0


def budget_status(tenant_id: int, *, now: datetime | None = None) -> list[BudgetStatus]:
    """Each budget of the tenant with its spend this period, from the counters the gateways
    check (so what is shown is what the next request is checked against)."""
    moment = now or timezone.now()
    budgets = list(budgets_of(tenant_id))
    bounds = [period_bounds(budget.period, moment) for budget in budgets]
    keys = []
    for budget, (label, _, _) in zip(budgets, bounds, strict=True):
        keys += [spend_key(tenant_id, budget.id, label), refused_key(tenant_id, budget.id, label)]
    counters = request_mget(keys) if keys else []
    return [
        BudgetStatus(
            budget=budget,
            spent=from_micros(int(counters[2 * i] or 0)),
            starts_at=start,
            resets_at=end,
            refused=counters[2 * i + 1] is not None,
        )
        for i, (budget, (_, start, end)) in enumerate(zip(budgets, bounds, strict=True))
    ]
