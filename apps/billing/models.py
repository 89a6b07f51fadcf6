"""Prices, budgets, prepaid balances and redemption codes; the usage ledger they are charged on.

Billing refers to tenants, keys and model versions by their apps' labels only (string foreign
keys): it sits below them in the layers and imports neither. Every amount is a Decimal of six
places (apps.billing.money converts to the micro-units the hot path counts in).
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.billing.choices import BillingMode, BudgetPeriod, MovementKind, UsageStatus
from apps.billing.money import MAX_AMOUNT

PRICE = {"max_digits": 12, "decimal_places": 6, "validators": [MinValueValidator(0)]}
AMOUNT = {"max_digits": 20, "decimal_places": 6}
# What people set: a budget, a threshold, a code's face value.
SET_AMOUNT = [MinValueValidator(0), MaxValueValidator(MAX_AMOUNT)]


class Price(models.Model):
    """A model version's prices per million tokens from `effective_from` on, until a later row
    for the version takes over. Rows are never changed: a new price is a new row, so a past
    request's cost never moves. All zero is a free model, marked so by an operator."""

    model_version = models.ForeignKey(
        "models.ModelVersion", on_delete=models.PROTECT, related_name="prices"
    )
    input_per_million = models.DecimalField(**PRICE, help_text="Prompt tokens.")
    cached_input_per_million = models.DecimalField(
        **PRICE, help_text="Prompt tokens the engine served from its prefix cache."
    )
    output_per_million = models.DecimalField(**PRICE, help_text="Generated tokens.")
    batch_discount_percent = models.PositiveSmallIntegerField(
        default=50,
        validators=[MaxValueValidator(100)],
        help_text="What a request of a batch (/v1/batches) pays less than these prices, percent.",
    )
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True, editable=False)

    class Meta:
        ordering = ["model_version", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_version", "effective_from"], name="price_version_from_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_version} from {self.effective_from:%Y-%m-%d %H:%M}"

    @property
    def free(self) -> bool:
        return not (
            self.input_per_million or self.cached_input_per_million or self.output_per_million
        )


class BillingAccount(models.Model):
    """A tenant's money: prepaid or postpaid, its balance (prepaid), and where its alerts go."""

    tenant = models.OneToOneField(
        "keys.Tenant", on_delete=models.CASCADE, related_name="billing_account"
    )
    mode = models.CharField(max_length=8, choices=BillingMode.choices, default=BillingMode.POSTPAID)
    balance = models.DecimalField(**AMOUNT, default=0)
    # Bumped with every movement, so two writers never both base a movement on one balance.
    version = models.PositiveBigIntegerField(default=0, editable=False)
    low_balance_threshold = models.DecimalField(
        **AMOUNT,
        null=True,
        blank=True,
        validators=SET_AMOUNT,
        help_text="Alert when the balance falls below this.",
    )
    notify_email = models.EmailField(blank=True, help_text="Empty: the tenant's owners.")
    webhook_url = models.URLField(blank=True)
    webhook_secret = models.CharField(max_length=64, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(balance__gte=0), name="billing_balance_not_negative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant} ({self.get_mode_display()})"


class BalanceMovement(models.Model):
    """One change of a balance; the balance is always the sum of its account's movements."""

    account = models.ForeignKey(BillingAccount, on_delete=models.PROTECT, related_name="movements")
    kind = models.CharField(max_length=12, choices=MovementKind.choices)
    amount = models.DecimalField(**AMOUNT, help_text="Positive credits, negative debits.")
    balance_after = models.DecimalField(**AMOUNT)
    # usage:<request id>, redeem:<code id>, topup:<client's key>: a movement happens once.
    idempotency_key = models.CharField(max_length=128, unique=True)
    note = models.CharField(max_length=255, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["account", "created_at"], name="movement_account_time_idx")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.amount}"


class Budget(models.Model):
    """A spending limit per UTC period for a tenant, or for one of its keys: hard refuses the
    request that could pass it, soft only alerts."""

    tenant = models.ForeignKey("keys.Tenant", on_delete=models.CASCADE, related_name="budgets")
    api_key = models.ForeignKey(
        "keys.ApiKey",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="budgets",
        help_text="Empty: the tenant's whole spend.",
    )
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    amount = models.DecimalField(**AMOUNT, validators=SET_AMOUNT)
    hard = models.BooleanField(default=True, help_text="Refuse past it; otherwise only alert.")
    locked = models.BooleanField(
        default=False,
        help_text="Set by an operator: the tenant's owners see it, and cannot change or remove "
        "it (their own budgets can only limit more).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "period"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "api_key", "period"],
                nulls_distinct=False,
                name="budget_owner_period_unique",
            )
        ]

    def __str__(self) -> str:
        owner = f"key {self.api_key_id}" if self.api_key_id else "tenant"
        return f"{self.tenant} {owner} {self.amount}/{self.period}"


class RedemptionBatch(models.Model):
    """Codes an operator generated together: same face value and expiry."""

    face_value = models.DecimalField(**AMOUNT, validators=SET_AMOUNT)
    count = models.PositiveIntegerField()
    expires_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(max_length=255, blank=True)
    created_by = models.CharField(max_length=150, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "redemption batches"

    def __str__(self) -> str:
        return f"{self.count} x {self.face_value} ({self.created_at:%Y-%m-%d})"


class RedemptionCode(models.Model):
    """One code, stored as its HMAC (the code itself is shown once, at generation)."""

    batch = models.ForeignKey(RedemptionBatch, on_delete=models.CASCADE, related_name="codes")
    code_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=8, editable=False, help_text="The code's last characters.")
    redeemed_by = models.ForeignKey(
        "keys.Tenant", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    redeemed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"…{self.hint}"


class Notification(models.Model):
    """An alert, sent once per subject and period (a budget at 80% in May is one row)."""

    tenant = models.ForeignKey("keys.Tenant", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32)
    subject = models.CharField(max_length=64, help_text="What it is about: budget:<id>, ...")
    period = models.CharField(max_length=16)
    payload = models.JSONField(default=dict)
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind", "subject", "period"], name="notification_once"
            )
        ]


class UsageRecord(models.Model):
    """One finished request: what it used and how it went. Written in batches from Redis."""

    request_id = models.CharField(max_length=64, unique=True)
    api_key = models.ForeignKey(
        "keys.ApiKey", on_delete=models.PROTECT, related_name="usage_records"
    )
    tenant = models.ForeignKey(
        "keys.Tenant", on_delete=models.PROTECT, related_name="usage_records"
    )
    created_at = models.DateTimeField(help_text="When the gateway received the request.")
    endpoint = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    model_version = models.CharField(max_length=64, blank=True)
    node = models.CharField(max_length=128, blank=True)
    intent = models.CharField(max_length=32, blank=True)
    intent_confidence = models.FloatField(
        null=True, blank=True, help_text="The classifier's calibrated probability for the intent."
    )
    intent_low_confidence = models.BooleanField(
        default=False,
        help_text="The confidence was under DMX_INTENT_MIN_CONFIDENCE: an alias routed it by "
        "its default route.",
    )
    stream = models.BooleanField(default=False)
    status = models.CharField(max_length=32, choices=UsageStatus.choices)
    http_status = models.PositiveSmallIntegerField()
    error_code = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(
        default=0, help_text="Prompt tokens the engine served from its prefix cache."
    )
    completion_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(
        max_digits=20,
        decimal_places=6,
        default=0,
        help_text="In DMX_CURRENCY, at the prices in force when the request arrived.",
    )
    duration_ms = models.FloatField(default=0.0)
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    estimated_prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    context_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Context tokens allowed when the request came in."
    )
    content_flags = models.JSONField(default=list, blank=True)
    timings = models.JSONField(default=dict, blank=True, help_text="Gateway stage timings, ms.")
    client_request_id = models.CharField(
        max_length=128, blank=True, help_text="The client's own id for it (X-Client-Request-Id)."
    )
    trace_id = models.CharField(
        max_length=32, blank=True, help_text="Its OpenTelemetry trace, when tracing is on."
    )
    batch_id = models.CharField(
        max_length=64, blank=True, help_text="The batch (/v1/batches) it ran in, if any."
    )

    class Meta:
        # The table keeps the name it had when keys kept the ledger.
        db_table = "keys_usagerecord"
        ordering = ["-created_at"]
        indexes = [
            # Per-key usage pages and retention both scan by key and time.
            models.Index(fields=["api_key", "created_at"], name="usage_key_time_idx"),
            models.Index(fields=["created_at"], name="usage_time_idx"),
            # The trace search finds a request by the client's id; most requests send none.
            models.Index(
                fields=["client_request_id"],
                condition=~models.Q(client_request_id=""),
                name="usage_client_request_idx",
            ),
            models.Index(
                fields=["batch_id"], condition=~models.Q(batch_id=""), name="usage_batch_idx"
            ),
        ]

    def __str__(self) -> str:
        return self.request_id

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageDaily(models.Model):
    """Usage per key, model and UTC day, kept in step with UsageRecord by the ledger flush."""

    day = models.DateField()
    api_key = models.ForeignKey("keys.ApiKey", on_delete=models.PROTECT, related_name="usage_days")
    tenant = models.ForeignKey("keys.Tenant", on_delete=models.PROTECT, related_name="usage_days")
    model = models.CharField(max_length=128)
    # Requests of batches apart: they are priced apart, and statements show them so.
    batch = models.BooleanField(default=False)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)

    class Meta:
        db_table = "keys_usagedaily"
        ordering = ["-day", "model"]
        verbose_name_plural = "usage by day"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "api_key", "model", "batch"], name="usage_daily_unique"
            ),
        ]
        indexes = [models.Index(fields=["tenant", "day"], name="usage_daily_tenant_day_idx")]

    def __str__(self) -> str:
        return f"{self.day} {self.model}"
