"""Billing's writes.

prices         a model version's price, set ahead; a price not yet in force withdrawn
budgets        spending limits per period, for a tenant or a key
balances       prepaid accounts: credits, usage charges, seeding Redis's copy, the ledger check
codes          redemption code batches and redeeming one
notifications  budget and balance alerts: recorded once per period, mailed, posted signed
recovery       billing's Redis counters put back after the request store lost them
usage          the usage ledger: flush from the Redis stream into records and daily rollups
               (costs, prepaid charges), replay, prune
"""

from apps.billing.services.balances import (
    Charge,
    account_of,
    account_update,
    balance_seed,
    credit,
    ledger_check,
    top_up,
    usage_charges,
)
from apps.billing.services.budgets import BudgetLocked, budget_delete, budget_set
from apps.billing.services.codes import RedemptionError, code_hash, codes_generate, redeem
from apps.billing.services.notifications import (
    AlertKind,
    Delivery,
    notification_deliver,
    notifications_raise,
    notifications_stranded,
    webhook_secret_ensure,
    webhook_signature,
)
from apps.billing.services.prices import price_set, price_withdraw
from apps.billing.services.recovery import balance_copies_drop, spend_restore, spend_restored
from apps.billing.services.usage import USAGE_PRUNE_BATCH, usage_flush, usage_prune, usage_replay

__all__ = [
    "USAGE_PRUNE_BATCH",
    "AlertKind",
    "BudgetLocked",
    "Charge",
    "Delivery",
    "RedemptionError",
    "account_of",
    "account_update",
    "balance_copies_drop",
    "balance_seed",
    "budget_delete",
    "budget_set",
    "code_hash",
    "codes_generate",
    "credit",
    "ledger_check",
    "notification_deliver",
    "notifications_raise",
    "notifications_stranded",
    "price_set",
    "price_withdraw",
    "redeem",
    "spend_restore",
    "spend_restored",
    "top_up",
    "usage_charges",
    "usage_flush",
    "usage_prune",
    "usage_replay",
    "webhook_secret_ensure",
    "webhook_signature",
]
