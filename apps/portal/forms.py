"""The portal's forms: they parse what a browser sends; the services decide what is allowed."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from decimal import Decimal

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.billing.choices import BudgetPeriod
from apps.billing.models import BillingAccount
from apps.billing.money import AMOUNT_INPUT_DIGITS, MAX_AMOUNT
from apps.billing.services.codes import MAX_CODE_LENGTH
from apps.keys.choices import MemberRole, QuotaPeriod, TokenScope
from apps.keys.models import ApiKey, Plan
from apps.keys.services import MAX_ROTATION_GRACE
from apps.models.selectors import llm_models_active

# Amounts are stored with six decimal places (apps.billing.money): a form takes no finer one.
AMOUNT_PLACES = 6
# No usage is older than the platform: an earlier month is a typing slip (and year 1's
# previous month is no date at all).
FIRST_STATEMENT_YEAR = 2000

# The portal offers management tokens for up to a year; the service allows a day more, so that
# "365 days" never fails on the hour a form took to submit.
MAX_TOKEN_DAYS = 365
DEFAULT_TOKEN_DAYS = 90
DEFAULT_GRACE_MINUTES = 60


class ServiceErrorsForm(forms.Form):
    def add_service_error(self, error: ValidationError) -> None:
        """Show a service's refusal on the fields it names, the rest above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for field, errors in error.error_dict.items():
            self.add_error(field if field in self.fields else None, errors)


def _positive(label: str, help_text: str = "") -> forms.IntegerField:
    return forms.IntegerField(label=label, min_value=1, required=False, help_text=help_text)


class KeyCreateForm(ServiceErrorsForm):
    name = forms.CharField(max_length=128)
    expires_at = forms.DateTimeField(
        label="Expires at (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Empty: never.",
    )
    allowed_models = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every model.",
    )
    allowed_networks = forms.CharField(
        label="Allowed client networks",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "10.0.0.0/8\n2001:db8::/32"}),
        help_text="One network in CIDR form per line. Empty: any address.",
    )
    requests_per_minute = _positive("Requests per minute")
    tokens_per_minute = _positive("Tokens per minute")
    max_concurrent_requests = _positive("Concurrent requests")
    token_quota = _positive("Token quota", "Tokens this key may use per period.")
    token_quota_period = forms.ChoiceField(
        label="Quota period",
        choices=QuotaPeriod.choices,
        initial=QuotaPeriod.MONTH,
        required=False,
    )

    LIMITS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")

    def __init__(self, *args, plan: Plan | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["allowed_models"].choices = [
            (model.name, f"{model.name} ({model.max_context_tokens:,} tokens of context)")
            for model in llm_models_active()
        ]
        for name in self.LIMITS:
            cap = getattr(plan, name, None)
            self.fields[name].help_text = (
                f"Your plan allows at most {cap:,}." if cap else "Empty: the plan's limit."
            )

    def clean_expires_at(self):
        expires_at = self.cleaned_data["expires_at"]
        if expires_at is not None and expires_at <= timezone.now():
            raise ValidationError("Choose a time in the future.")
        return expires_at

    def clean_allowed_networks(self) -> list[str]:
        lines = self.cleaned_data["allowed_networks"].splitlines()
        return [line.strip() for line in lines if line.strip()]

    def service_arguments(self) -> dict:
        """The form's values as api_key_create's keyword arguments."""
        data = dict(self.cleaned_data)
        if not data["token_quota"] or not data["token_quota_period"]:
            # Without a quota the period means nothing; without a period, the model's default.
            data.pop("token_quota_period")
        return data


class KeyRotateForm(forms.Form):
    grace_minutes = forms.DecimalField(
        label="Grace period (minutes)",
        min_value=Decimal(0),
        max_value=Decimal(int(MAX_ROTATION_GRACE.total_seconds() // 60)),
        decimal_places=3,
        initial=DEFAULT_GRACE_MINUTES,
        help_text="How long the old secret keeps working: 0 to 1440 (24 hours); "
        "decimals allowed (0.5 = 30 seconds).",
    )

    @property
    def grace(self) -> timedelta:
        return timedelta(minutes=float(self.cleaned_data["grace_minutes"]))


class InviteForm(ServiceErrorsForm):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=MemberRole.choices, initial=MemberRole.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=MemberRole.choices)


class TenantSwitchForm(forms.Form):
    tenant = forms.IntegerField()


class TokenCreateForm(ServiceErrorsForm):
    name = forms.CharField(max_length=128)
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_in_days = forms.IntegerField(
        label="Expires in (days)",
        min_value=1,
        max_value=MAX_TOKEN_DAYS,
        initial=DEFAULT_TOKEN_DAYS,
    )

    @property
    def expires_at(self):
        return timezone.now() + timedelta(days=self.cleaned_data["expires_in_days"])


class UsageExportForm(forms.Form):
    since = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(
        label="Until (included)", widget=forms.DateInput(attrs={"type": "date"})
    )

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("since") and cleaned.get("until") and cleaned["since"] > cleaned["until"]:
            raise ValidationError("The range ends before it starts.")
        return cleaned


def _amount(label: str, **kwargs) -> forms.DecimalField:
    return forms.DecimalField(
        label=f"{label} ({settings.DMX_CURRENCY})",
        max_digits=AMOUNT_INPUT_DIGITS,
        decimal_places=AMOUNT_PLACES,
        min_value=Decimal(0),
        max_value=MAX_AMOUNT,
        **kwargs,
    )


class RedeemForm(forms.Form):
    code = forms.CharField(
        label="Redemption code",
        max_length=MAX_CODE_LENGTH,
        widget=forms.TextInput(
            attrs={
                "placeholder": "DMX-XXXX-XXXX-XXXX-XXXX-XXXX",
                "autocomplete": "off",
                "spellcheck": "false",
            }
        ),
    )


HARD, SOFT = "hard", "soft"


class BudgetForm(ServiceErrorsForm):
    """A budget for the tenant or one of its keys; the same scope and period again changes it."""

    applies_to = forms.ChoiceField(label="Applies to", required=False)
    period = forms.ChoiceField(choices=BudgetPeriod.choices, initial=BudgetPeriod.MONTH)
    amount = _amount("Amount")
    enforcement = forms.ChoiceField(
        choices=[
            (HARD, "Hard: refuse requests that could pass it"),
            (SOFT, "Soft: only alert"),
        ],
        initial=HARD,
        widget=forms.RadioSelect,
    )

    def __init__(self, *args, keys: Iterable[ApiKey], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keys = {key.key_id: key for key in keys}
        self.fields["applies_to"].choices = [("", "The whole tenant")] + [
            (key.key_id, f"Key “{key.name}” ({key.display_prefix})") for key in self.keys.values()
        ]

    def service_arguments(self) -> dict:
        """The form's values as budget_set's keyword arguments (but the tenant)."""
        key = self.keys.get(self.cleaned_data["applies_to"])
        return {
            "api_key_id": key.id if key else None,
            "period": self.cleaned_data["period"],
            "amount": self.cleaned_data["amount"],
            "hard": self.cleaned_data["enforcement"] == HARD,
        }


class BillingAlertsForm(ServiceErrorsForm):
    """Where a tenant's budget and balance alerts go, and when the balance one fires."""

    low_balance_threshold = _amount(
        "Low-balance alert below",
        required=False,
        help_text="Empty: no low-balance alert.",
    )
    notify_email = forms.EmailField(
        label="Alert email", required=False, help_text="Empty: the tenant's owners."
    )
    webhook_url = forms.URLField(
        label="Webhook URL",
        required=False,
        assume_scheme="https",
        help_text="Alerts are sent here as signed JSON POSTs. Empty: no webhook.",
    )

    @classmethod
    def initial_from(cls, account: BillingAccount) -> dict:
        """The account's settings as the form's initial values (10, not 10.000000)."""
        threshold = account.low_balance_threshold
        return {
            "low_balance_threshold": None if threshold is None else f"{threshold.normalize():f}",
            "notify_email": account.notify_email,
            "webhook_url": account.webhook_url,
        }


class StatementForm(forms.Form):
    month = forms.DateField(
        input_formats=["%Y-%m"],
        widget=forms.DateInput(format="%Y-%m", attrs={"type": "month"}),
        error_messages={"invalid": "Choose a month (YYYY-MM)."},
    )

    def clean_month(self):
        month = self.cleaned_data["month"]
        if month.year < FIRST_STATEMENT_YEAR:
            raise ValidationError(f"Statements start in {FIRST_STATEMENT_YEAR}.")
        if month > timezone.now().date():
            raise ValidationError("That month has not begun.")
        return month
