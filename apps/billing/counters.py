"""The counters the gateways check money against: a tenant's prepaid balance and its budgets'
spend per period, in micro-units, in Redis beside (in the same cluster slot as) the tenant's
rate-limit counters, so that one admission script checks them all. Budget periods are UTC
calendar days, ISO weeks (from Monday) and months."""

from __future__ import annotations

from datetime import datetime, timedelta

from apps.billing.choices import BudgetPeriod
from dmxplatform.redis_client import tenant_rkey


def balance_key(tenant_id: int) -> str:
    # tenant_rkey names the tenant's shard only: the key names the tenant itself.
    return tenant_rkey(tenant_id, "balance", tenant_id)


def credited_key(tenant_id: int, idempotency_key: str) -> str:
    """Marks a credit Redis's copy of the balance took, so that a retried call takes it once."""
    return tenant_rkey(tenant_id, "credited", tenant_id, idempotency_key)


# keys.choices.QuotaPeriod.HOUR, which billing (below keys) does not import.
HOUR = "hour"
# Period counters (quotas' and budgets' spend) outlive their period by a day, so that late
# settlements still find them.
PERIOD_GRACE = timedelta(days=1)


def spend_key(tenant_id: int, budget_id: int, label: str) -> str:
    """The spend counter of one budget in the period `label` (period_bounds)."""
    return tenant_rkey(tenant_id, "spend", tenant_id, budget_id, label)


def refused_key(tenant_id: int, budget_id: int, label: str) -> str:
    """Set by the admission script when the budget turned a request away in the period."""
    return spend_key(tenant_id, budget_id, label) + ":refused"


def period_bounds(period: str, now: datetime) -> tuple[str, datetime, datetime]:
    """The label, start and end of the UTC calendar period containing `now`: an hour (keys'
    token quotas have them, budgets not), a day, an ISO week (from Monday) or a month. Quota and
    budget counters are named by the label."""
    if period == HOUR:
        start = now.replace(minute=0, second=0, microsecond=0)
        return start.strftime("%Y%m%d%H"), start, start + timedelta(hours=1)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == BudgetPeriod.DAY:
        return day.strftime("%Y%m%d"), day, day + timedelta(days=1)
    if period == BudgetPeriod.WEEK:
        start = day - timedelta(days=day.weekday())
        year, week, _ = start.isocalendar()
        return f"{year}W{week:02d}", start, start + timedelta(days=7)
    start = day.replace(day=1)
    return start.strftime("%Y%m"), start, (start + timedelta(days=32)).replace(day=1)


def period_ttl_ms(end: datetime, now: datetime) -> int:
    """How long a counter of the period ending at `end` lives in Redis, from `now`."""
    return int((end + PERIOD_GRACE - now).total_seconds() * 1000)
