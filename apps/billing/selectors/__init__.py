"""Billing's reads.

prices    the price list: each model version's price in force and the next one scheduled
accounts  a tenant's account, balance and movements; budgets and their spend this period
usage     usage records and their search, daily rollups and series, the per-minute series
statements  a tenant's monthly statement: usage and cost per model, balance movements
"""

from apps.billing.selectors.accounts import (
    BudgetStatus,
    account_find,
    budget_status,
    budgets_of,
    movements_of,
)
from apps.billing.selectors.prices import PriceLine, price_list, prices_of_version
from apps.billing.selectors.statements import Statement, StatementLine, month_bounds, statement_of
from apps.billing.selectors.usage import (
    LATENCY_PERCENTILE,
    RUNNING_MINUTE_MIN_SECONDS,
    USAGE_MINUTES,
    DailySeries,
    IntentFigures,
    KeyUsageColumns,
    MinuteSeries,
    ModelMinutes,
    key_usage_columns,
    usage_by_intent,
    usage_by_key,
    usage_daily_of,
    usage_daily_series,
    usage_minute_series,
    usage_of_batches,
    usage_record_find,
    usage_records_of,
    usage_records_search,
)

__all__ = [
    "LATENCY_PERCENTILE",
    "RUNNING_MINUTE_MIN_SECONDS",
    "USAGE_MINUTES",
    "BudgetStatus",
    "DailySeries",
    "IntentFigures",
    "KeyUsageColumns",
    "MinuteSeries",
    "ModelMinutes",
    "PriceLine",
    "Statement",
    "StatementLine",
    "account_find",
    "budget_status",
    "budgets_of",
    "key_usage_columns",
    "month_bounds",
    "movements_of",
    "price_list",
    "prices_of_version",
    "statement_of",
    "usage_by_intent",
    "usage_by_key",
    "usage_daily_of",
    "usage_daily_series",
    "usage_minute_series",
    "usage_of_batches",
    "usage_record_find",
    "usage_records_of",
    "usage_records_search",
]
