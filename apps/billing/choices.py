from django.db import models


class UsageStatus(models.TextChoices):
    """How a request ended, as its usage record keeps it."""

    OK = "ok", "Completed"
    CLIENT_DISCONNECTED = "client_disconnected", "Client disconnected"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    REJECTED = "rejected", "Rejected"
    CONTENT_FILTERED = "content_filtered", "Stopped by the content filter"
    TIMED_OUT = "timed_out", "Ran past the request timeout"
    INTERRUPTED = "interrupted", "Cut off by the gateway's shutdown"


class BillingMode(models.TextChoices):
    """Postpaid tenants are billed for what they used; prepaid ones spend a balance first."""

    POSTPAID = "postpaid", "Postpaid"
    PREPAID = "prepaid", "Prepaid"


class MovementKind(models.TextChoices):
    TOP_UP = "top_up", "Top-up"
    REDEMPTION = "redemption", "Redemption code"
    CHARGE = "charge", "Usage charge"
    REFUND = "refund", "Refund"
    ADJUSTMENT = "adjustment", "Adjustment"


class BudgetPeriod(models.TextChoices):
    """UTC calendar periods; a week starts on Monday (ISO 8601)."""

    DAY = "day", "Day"
    WEEK = "week", "Week"
    MONTH = "month", "Month"


# How a refusal or an alert names a budget of each period: "your monthly budget".
PERIOD_ADJECTIVES = {
    BudgetPeriod.DAY: "daily",
    BudgetPeriod.WEEK: "weekly",
    BudgetPeriod.MONTH: "monthly",
}
