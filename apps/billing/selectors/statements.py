"""Monthly statements: a tenant's usage and cost per model for one UTC month, from the daily
rollups (which the flush keeps equal to the sum of the usage records, cost included, each
record's cost rounded once), and, for a prepaid tenant, the balance movements of the month."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from apps.billing.models import UsageDaily
from apps.billing.selectors.accounts import movements_of


@dataclass(frozen=True, slots=True)
class StatementLine:
    model: str
    batch: bool  # requests of batches, at the batch price
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: Decimal


@dataclass(frozen=True, slots=True)
class Statement:
    tenant_id: int
    month: date  # its first day
    lines: list[StatementLine]
    total: Decimal
    # Prepaid: what the month's usage charges, top-ups and redemptions moved, by kind.
    movements: dict[str, Decimal]


def month_bounds(month: date) -> tuple[date, date]:
    start = month.replace(day=1)
    following = date(start.year + start.month // 12, start.month % 12 + 1, 1)
    return start, following


def statement_of(*, tenant_id: int, month: date) -> Statement:
    start, end = month_bounds(month)
    rows = (
        UsageDaily.objects.filter(tenant_id=tenant_id, day__gte=start, day__lt=end)
        .values("model", "batch")
        .annotate(
            n=Coalesce(Sum("requests"), 0),
            prompt=Coalesce(Sum("prompt_tokens"), 0),
            cached=Coalesce(Sum("cached_tokens"), 0),
            completion=Coalesce(Sum("completion_tokens"), 0),
            cost_sum=Coalesce(Sum("cost"), Decimal(0)),
        )
        .order_by("model", "batch")
    )
    lines = [
        StatementLine(
            model=row["model"],
            batch=row["batch"],
            requests=row["n"],
            prompt_tokens=row["prompt"],
            cached_tokens=row["cached"],
            completion_tokens=row["completion"],
            cost=row["cost_sum"],
        )
        for row in rows
    ]
    moved = (
        movements_of(tenant_id)
        .filter(created_at__date__gte=start, created_at__date__lt=end)
        .values("kind")
        .annotate(total=Sum("amount"), count=Count("id"))
    )
    return Statement(
        tenant_id=tenant_id,
        month=start,
        lines=lines,
        total=sum((line.cost for line in lines), Decimal(0)),
        movements={row["kind"]: row["total"] for row in moved},
    )
