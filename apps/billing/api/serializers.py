"""What the management API reads and writes of billing: prices, a tenant's account, movements
and budgets, redemptions, usage records, daily totals and statements, and (operators) top-ups,
prices and code batches.

Every amount is a decimal string with six places (micro-units of DMX_CURRENCY), in and out: a
JSON number would be a float on the way, which money never is.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.billing.choices import BillingMode, BudgetPeriod, MovementKind
from apps.billing.models import (
    BalanceMovement,
    Price,
    RedemptionBatch,
    RedemptionCode,
    UsageDaily,
    UsageRecord,
)
from apps.billing.money import AMOUNT_INPUT_DIGITS, MAX_AMOUNT
from apps.billing.services.codes import MAX_BATCH, MAX_CODE_LENGTH

PLACES = 6
SMALLEST = Decimal(1).scaleb(-PLACES)  # 0.000001
# Digits of an amount a caller sets (a top-up, a budget, a code's face value); the services
# hold it to MAX_AMOUNT (apps.billing.money).
# A price per million tokens: the model's Price columns.
PRICE_DIGITS = 12
# The stored amounts' digits (balances, costs): what may come out.
STORED_DIGITS = 20
# The last month a statement can be asked for: its end is the first day of the next one.
LAST_STATEMENT_YEAR = 9998


class Money(serializers.DecimalField):
    """An amount in DMX_CURRENCY: a decimal string with six places, e.g. "12.500000"."""

    default_error_messages = {
        "not_a_string": 'Send amounts as decimal strings, e.g. "12.5", never as JSON numbers.'
    }

    def __init__(self, *, max_digits: int = STORED_DIGITS, **kwargs) -> None:
        super().__init__(
            max_digits=max_digits, decimal_places=PLACES, coerce_to_string=True, **kwargs
        )

    def to_internal_value(self, data):
        if isinstance(data, float | bool):
            self.fail("not_a_string")
        return super().to_internal_value(data)


def _currency() -> str:
    return settings.DMX_CURRENCY


# Prices ----------------------------------------------------------------------------------------


class ScheduledPriceOutput(serializers.ModelSerializer):
    input_per_million = Money(max_digits=PRICE_DIGITS)
    cached_input_per_million = Money(max_digits=PRICE_DIGITS)
    output_per_million = Money(max_digits=PRICE_DIGITS)

    class Meta:
        model = Price
        fields = [
            "input_per_million",
            "cached_input_per_million",
            "output_per_million",
            "effective_from",
        ]
        read_only_fields = fields


class PriceListOutput(serializers.Serializer):
    """A model version's price in force, per million tokens, and the next one scheduled."""

    model = serializers.CharField(help_text="What requests name in `model`.")
    version = serializers.CharField()
    kind = serializers.CharField(help_text="`generate` (chat, completions) or `embed`.")
    currency = serializers.SerializerMethodField()
    input_per_million = Money(source="price.input_per_million", max_digits=PRICE_DIGITS)
    cached_input_per_million = Money(
        source="price.cached_input_per_million",
        max_digits=PRICE_DIGITS,
        help_text="Prompt tokens the engine served from its prefix cache.",
    )
    output_per_million = Money(source="price.output_per_million", max_digits=PRICE_DIGITS)
    free = serializers.BooleanField(source="price.free")
    effective_from = serializers.DateTimeField(source="price.effective_from")
    next = ScheduledPriceOutput(
        allow_null=True, help_text="The price scheduled to take over, if any."
    )

    @extend_schema_field(serializers.CharField(help_text="ISO 4217, the platform's one."))
    def get_currency(self, line) -> str:
        return _currency()


class PriceOutput(serializers.ModelSerializer):
    """One price of a model version, as operators set it."""

    model = serializers.CharField(source="model_version.model.name")
    version = serializers.CharField(source="model_version.tag")
    model_version = serializers.IntegerField(source="model_version_id")
    input_per_million = Money(max_digits=PRICE_DIGITS)
    cached_input_per_million = Money(max_digits=PRICE_DIGITS)
    output_per_million = Money(max_digits=PRICE_DIGITS)
    free = serializers.BooleanField()

    class Meta:
        model = Price
        fields = [
            "id",
            "model",
            "version",
            "model_version",
            "input_per_million",
            "cached_input_per_million",
            "output_per_million",
            "free",
            "effective_from",
            "created_at",
            "created_by",
        ]
        read_only_fields = fields


class PriceInput(serializers.Serializer):
    input_per_million = Money(max_digits=PRICE_DIGITS, min_value=Decimal(0))
    cached_input_per_million = Money(
        max_digits=PRICE_DIGITS,
        min_value=Decimal(0),
        required=False,
        allow_null=True,
        help_text="At most the input price; empty: the input price.",
    )
    output_per_million = Money(max_digits=PRICE_DIGITS, min_value=Decimal(0))
    effective_from = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="No earlier than DMX_PRICE_LEAD_SECONDS from now once the version has a "
        "price; empty: as soon as allowed. All three prices zero marks the version free.",
    )


# A tenant's account, movements, budgets ---------------------------------------------------------


class AccountOutput(serializers.Serializer):
    mode = serializers.ChoiceField(
        choices=BillingMode.choices,
        help_text="`prepaid`: requests spend the balance first; `postpaid`: billed for use.",
    )
    balance = Money()
    currency = serializers.SerializerMethodField()
    low_balance_threshold = Money(allow_null=True, help_text="Alert below this; null: never.")
    notify_email = serializers.EmailField(help_text="Empty: the tenant's owners.")
    webhook_url = serializers.URLField()

    @extend_schema_field(serializers.CharField(help_text="ISO 4217, the platform's one."))
    def get_currency(self, account) -> str:
        return _currency()


class OperatorAccountOutput(AccountOutput):
    tenant = serializers.IntegerField(source="tenant_id")


class AccountInput(serializers.Serializer):
    """What a tenant's owners set: where and when its alerts go."""

    low_balance_threshold = Money(
        max_digits=AMOUNT_INPUT_DIGITS,
        min_value=Decimal(0),
        max_value=MAX_AMOUNT,
        allow_null=True,
        required=False,
    )
    notify_email = serializers.EmailField(max_length=254, allow_blank=True, required=False)
    webhook_url = serializers.URLField(max_length=200, allow_blank=True, required=False)

    def validate_webhook_url(self, url: str) -> str:
        if url and not url.lower().startswith(("https://", "http://")):
            raise serializers.ValidationError("An http:// or https:// URL.")
        return url


class OperatorAccountInput(AccountInput):
    mode = serializers.ChoiceField(choices=BillingMode.choices, required=False)


class MovementOutput(serializers.ModelSerializer):
    amount = Money(help_text="Positive credits, negative debits.")
    balance_after = Money()
    request_id = serializers.SerializerMethodField()

    class Meta:
        model = BalanceMovement
        fields = ["id", "kind", "amount", "balance_after", "note", "request_id", "created_at"]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(allow_null=True, help_text="The request a usage charge is for.")
    )
    def get_request_id(self, movement: BalanceMovement) -> str | None:
        if movement.kind == MovementKind.CHARGE:
            return movement.idempotency_key.removeprefix("usage:")
        return None


class BudgetOutput(serializers.Serializer):
    """A budget, and where its period stands (from the counters the gateways check)."""

    id = serializers.IntegerField(source="budget.id")
    key = serializers.CharField(
        source="budget.api_key.key_id",
        allow_null=True,
        help_text="The key's id (key_id) for a key's budget; null: the whole tenant's.",
    )
    period = serializers.ChoiceField(source="budget.period", choices=BudgetPeriod.choices)
    amount = Money(source="budget.amount")
    locked = serializers.BooleanField(
        source="budget.locked",
        help_text="Set by the platform's operators: owners cannot change or remove it (403 "
        "`budget_locked`).",
    )
    hard = serializers.BooleanField(
        source="budget.hard", help_text="Refuse requests past it; false: only alert."
    )
    spent = Money(help_text="This period, requests in flight counted at what they may cost.")
    starts_at = serializers.DateTimeField()
    resets_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField(source="budget.created_at")


class BudgetInput(serializers.Serializer):
    """A budget per UTC period; one per key (or the tenant) and period: setting it again
    replaces it."""

    period = serializers.ChoiceField(choices=BudgetPeriod.choices)
    amount = Money(max_digits=AMOUNT_INPUT_DIGITS, min_value=Decimal(0), max_value=MAX_AMOUNT)
    hard = serializers.BooleanField(default=True)
    key = serializers.CharField(
        max_length=64,
        required=False,
        allow_null=True,
        help_text="A key's id (key_id) for one key's budget; empty: the whole tenant's.",
    )


class BudgetChangeInput(serializers.Serializer):
    amount = Money(
        max_digits=AMOUNT_INPUT_DIGITS, min_value=Decimal(0), max_value=MAX_AMOUNT, required=False
    )
    hard = serializers.BooleanField(required=False)


class RedeemInput(serializers.Serializer):
    code = serializers.CharField(max_length=MAX_CODE_LENGTH, help_text="As printed: DMX-XXXX-...")


# Operators: top-ups and code batches ------------------------------------------------------------


class TopUpInput(serializers.Serializer):
    amount = Money(max_digits=AMOUNT_INPUT_DIGITS, min_value=SMALLEST, max_value=MAX_AMOUNT)
    note = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class BatchOutput(serializers.ModelSerializer):
    face_value = Money()
    redeemed = serializers.IntegerField(help_text="How many of its codes were redeemed.")

    class Meta:
        model = RedemptionBatch
        fields = [
            "id",
            "face_value",
            "count",
            "redeemed",
            "expires_at",
            "note",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class BatchWithCodes(BatchOutput):
    codes = serializers.ListField(
        source="plaintext_codes",
        child=serializers.CharField(),
        help_text="The codes themselves: shown this once, stored only as their HMACs.",
    )

    class Meta(BatchOutput.Meta):
        fields = [*BatchOutput.Meta.fields, "codes"]
        read_only_fields = fields


class CodeOutput(serializers.ModelSerializer):
    hint = serializers.CharField(help_text="The code's last characters.")
    redeemed_by = serializers.IntegerField(
        source="redeemed_by_id", allow_null=True, help_text="The tenant that redeemed it."
    )

    class Meta:
        model = RedemptionCode
        fields = ["hint", "redeemed_by", "redeemed_at"]
        read_only_fields = fields


class BatchDetailOutput(BatchOutput):
    codes = CodeOutput(many=True, help_text="Its codes, by their last characters.")

    class Meta(BatchOutput.Meta):
        fields = [*BatchOutput.Meta.fields, "codes"]
        read_only_fields = fields


class BatchInput(serializers.Serializer):
    face_value = Money(max_digits=AMOUNT_INPUT_DIGITS, min_value=SMALLEST, max_value=MAX_AMOUNT)
    count = serializers.IntegerField(min_value=1, max_value=MAX_BATCH)
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Empty: the codes never expire."
    )
    note = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")

    def validate_expires_at(self, moment):
        if moment is not None and moment <= timezone.now():
            raise serializers.ValidationError("A moment in the future.")
        return moment


# Usage and statements -----------------------------------------------------------------------------


class UsageRecordOutput(serializers.ModelSerializer):
    key = serializers.CharField(source="api_key.key_id", help_text="The key's id (key_id).")
    total_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField(
        help_text="Prompt tokens the engine served from its prefix cache (billed at the cached "
        "input price)."
    )
    cost = Money(help_text="At the prices in force when the request arrived, in DMX_CURRENCY.")

    class Meta:
        model = UsageRecord
        fields = [
            "request_id",
            "created_at",
            "key",
            "endpoint",
            "model",
            "model_version",
            "intent",
            "stream",
            "status",
            "http_status",
            "error_code",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "total_tokens",
            "cost",
            "duration_ms",
            "time_to_first_token_ms",
        ]
        read_only_fields = fields


class UsageDailyOutput(serializers.ModelSerializer):
    key = serializers.CharField(source="api_key.key_id", help_text="The key's id (key_id).")
    total_tokens = serializers.SerializerMethodField()
    cost = Money(help_text="The day's requests' costs added up, in DMX_CURRENCY.")

    class Meta:
        model = UsageDaily
        fields = [
            "day",
            "key",
            "model",
            "requests",
            "errors",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "total_tokens",
            "cost",
        ]
        read_only_fields = fields

    def get_total_tokens(self, day: UsageDaily) -> int:
        return day.prompt_tokens + day.completion_tokens


class StatementQuery(serializers.Serializer):
    month = serializers.CharField(
        required=False, help_text="The UTC month, YYYY-MM; empty: this month."
    )

    def validate_month(self, text: str) -> date:
        try:
            month = datetime.strptime(text, "%Y-%m").date()  # noqa: DTZ007 (a calendar month)
        except ValueError:
            raise serializers.ValidationError("A month as YYYY-MM, e.g. 2026-05.") from None
        if month.year > LAST_STATEMENT_YEAR:
            raise serializers.ValidationError(f"A month before {LAST_STATEMENT_YEAR + 1}.")
        return month


class StatementLineOutput(serializers.Serializer):
    model = serializers.CharField()
    batch = serializers.BooleanField(help_text="Requests of batches, at the batch price.")
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField(help_text="Cached tokens included.")
    cached_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cost = Money()


class StatementOutput(serializers.Serializer):
    """A tenant's usage and cost per model for a UTC month; for a prepaid tenant, what moved
    its balance, by kind."""

    month = serializers.SerializerMethodField()
    currency = serializers.SerializerMethodField()
    lines = StatementLineOutput(many=True)
    total = Money(help_text="The lines' costs added up.")
    movements = serializers.DictField(
        child=Money(),
        help_text="The month's balance movements added up by kind (top_up, redemption, "
        "charge, refund, adjustment); debits are negative.",
    )

    @extend_schema_field(serializers.CharField(help_text="The UTC month, YYYY-MM."))
    def get_month(self, statement) -> str:
        return f"{statement.month:%Y-%m}"

    @extend_schema_field(serializers.CharField(help_text="ISO 4217, the platform's one."))
    def get_currency(self, statement) -> str:
        return settings.DMX_CURRENCY
