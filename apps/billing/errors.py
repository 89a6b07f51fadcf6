from enum import StrEnum


class BillingErrorCode(StrEnum):
    MODEL_NOT_PRICED = "model_not_priced"
    BUDGET_EXCEEDED = "insufficient_quota"  # OpenAI's code for a spending limit reached
    BALANCE_TOO_LOW = "insufficient_balance"
    CODE_INVALID = "redemption_code_invalid"
    CODE_USED = "redemption_code_used"
    CODE_EXPIRED = "redemption_code_expired"
    BUDGET_LOCKED = "budget_locked"
