"""Billing's reads.

prices    the price list: each model version's price in force and the next one scheduled
accounts  a tenant's account, balance and movements; budgets and their spend this period
"""

from apps.billing.selectors.accounts import (
    BudgetStatus,
    account_find,
    budget_status,
    budgets_of,
    movements_of,
)
from apps.billing.selectors.prices import PriceLine, price_list, prices_of_version

__all__ = [
    "BudgetStatus",
    "PriceLine",
    "account_find",
    "budget_status",
    "budgets_of",
    "movements_of",
    "price_list",
    "prices_of_version",
]
