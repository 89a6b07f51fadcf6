"""The console's billing: prices per model version (set ahead, never edited), tenants' accounts
with their top-ups, budgets, redemption code batches (their codes shown once) and what was
sent as alerts, and the usage ledger (records and daily rollups). Every write goes through
billing's services; the rows the platform writes itself (movements, codes, notifications,
usage) are read-only."""

from __future__ import annotations

import base64
import csv
import io
import logging
import uuid
from datetime import timedelta
from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.db.models import F, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from redis.exceptions import RedisError

from apps.billing.models import (
    BalanceMovement,
    BillingAccount,
    Budget,
    Notification,
    Price,
    RedemptionBatch,
    RedemptionCode,
    UsageDaily,
    UsageRecord,
)
from apps.billing.selectors import budget_status, movements_of
from apps.billing.selectors.admin_api import batches_with_counts, prices_with_standing
from apps.billing.services import (
    account_of,
    account_update,
    budget_delete,
    budget_set,
    codes_generate,
    price_set,
    price_withdraw,
    top_up,
)
from apps.billing.services.codes import MAX_BATCH
from dmxplatform.admin import (
    OperatorActions,
    ReadOnlyAdminMixin,
    ServiceDeletesMixin,
    request_trace_link,
)

logger = logging.getLogger(__name__)

PRICE_FIELDS = ("input_per_million", "cached_input_per_million", "output_per_million")
# Movements shown on an account's page; the rest are a link away (a prepaid tenant has one per
# request).
RECENT_MOVEMENTS = 20
# The generate-batch forms a session remembers as sent, so that a resent form (a reload of the
# codes' page) never makes a second batch.
SENT_FORMS_KEPT = 50
SENT_FORMS = "billing_batch_forms_sent"
# Never kept by a browser or a proxy: the page and the CSV carry the codes in the clear.
NOT_STORED = "no-store"
NONCE = RegexValidator(r"^[0-9a-f]{32}$", "A form made by this page.")


def _money(amount: Decimal | None) -> str:
    return "-" if amount is None else f"{amount:.6f} {settings.DMX_CURRENCY}"


def _form_page(admin_, request: HttpRequest, title: str, form, template: str, **extra):
    context = {
        **admin_.admin_site.each_context(request),
        "opts": admin_.opts,
        "title": title,
        "form": form,
        **extra,
    }
    return TemplateResponse(request, template, context)


def _errors_to_form(form: forms.Form, error: ValidationError) -> None:
    """A service's ValidationError on the form: each field's under it, the rest on top."""
    if hasattr(error, "error_dict"):
        for field, field_messages in error.message_dict.items():
            form.add_error(field if field in form.fields else None, field_messages)
    else:
        form.add_error(None, error.messages)


# Prices ----------------------------------------------------------------------------------------


class PriceForm(forms.Form):
    model_version = forms.ModelChoiceField(
        queryset=Price._meta.get_field("model_version")
        .related_model.objects.select_related("model")
        .order_by("model__name", "tag")
    )
    free = forms.BooleanField(
        required=False, help_text="Served without charge: all three prices zero."
    )
    input_per_million = forms.DecimalField(
        max_digits=12, decimal_places=6, min_value=0, required=False, help_text="Prompt tokens."
    )
    cached_input_per_million = forms.DecimalField(
        max_digits=12,
        decimal_places=6,
        min_value=0,
        required=False,
        help_text="Prompt tokens the engine served from its prefix cache; empty: the input price.",
    )
    output_per_million = forms.DecimalField(
        max_digits=12, decimal_places=6, min_value=0, required=False, help_text="Generated tokens."
    )
    effective_from = forms.SplitDateTimeField(
        widget=AdminSplitDateTime,
        required=False,
        help_text="Empty: as soon as allowed. A version that has a price takes a new one no "
        "earlier than DMX_PRICE_LEAD_SECONDS from now, so that every gateway holds it first.",
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("free"):
            data.update({name: Decimal(0) for name in PRICE_FIELDS})
            return data
        for name in ("input_per_million", "output_per_million"):
            if data.get(name) is None and name not in self.errors:
                self.add_error(name, "Required unless the version is free.")
        return data


class StandingFilter(admin.SimpleListFilter):
    title = "standing"
    parameter_name = "standing"

    def lookups(self, request: HttpRequest, model_admin) -> list[tuple[str, str]]:
        return [
            ("in_force", "In force"),
            ("scheduled", "Scheduled"),
            ("superseded", "Superseded"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Price]) -> QuerySet[Price]:
        if self.value() == "in_force":
            return queryset.filter(effective_from=F("in_force_from"))
        if self.value() == "scheduled":
            return queryset.filter(effective_from__gt=timezone.now())
        if self.value() == "superseded":
            return queryset.filter(effective_from__lt=F("in_force_from"))
        return queryset


@admin.register(Price)
class PriceAdmin(OperatorActions, ServiceDeletesMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """A price is never edited: a new one takes over from its moment (the add page, through
    price_set); one not in force yet may be withdrawn (deleted, through price_withdraw)."""

    list_display = [
        "model_version",
        "input_per_million",
        "cached_input_per_million",
        "output_per_million",
        "effective_from",
        "standing",
        "created_by",
    ]
    list_filter = [StandingFilter, "model_version__model", "model_version"]
    search_fields = ["model_version__model__name", "model_version__tag"]
    date_hierarchy = "effective_from"
    readonly_fields = ["free", "created_at", "created_by"]
    actions = ["mark_free"]
    console_refuses = ("change",)  # history: a new price is a new row

    def get_queryset(self, request: HttpRequest) -> QuerySet[Price]:
        return prices_with_standing()

    @admin.display(description="Standing")
    def standing(self, price: Price) -> str:
        if price.effective_from > timezone.now():
            return "scheduled"
        return "in force" if price.effective_from == price.in_force_from else "superseded"

    def has_delete_permission(self, request: HttpRequest, obj: Price | None = None) -> bool:
        # Only a price no gateway may have used yet (price_withdraw's rule, which decides).
        lead = timedelta(seconds=settings.DMX_PRICE_LEAD_SECONDS)
        if obj is not None and obj.effective_from <= timezone.now() + lead:
            return False
        return super().has_delete_permission(request, obj)

    def delete_row(self, obj: Price) -> None:
        price_withdraw(price=obj)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context=None):
        """Set a model version's price from a moment on, through price_set."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = PriceForm(request.POST or None, initial=request.GET.dict())
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                price = price_set(
                    model_version_id=data["model_version"].id,
                    input_per_million=data["input_per_million"],
                    cached_input_per_million=data["cached_input_per_million"],
                    output_per_million=data["output_per_million"],
                    effective_from=data["effective_from"],
                    actor=request.user.get_username(),
                )
            except ValidationError as error:
                _errors_to_form(form, error)
            else:
                self.log_addition(request, price, [{"added": {}}])
                messages.success(request, f"Price set: {price}.")
                return HttpResponseRedirect(reverse("admin:billing_price_changelist"))
        return _form_page(
            self,
            request,
            "Set a price",
            form,
            "admin/billing/price/add.html",
            media=form.media,
            currency=settings.DMX_CURRENCY,
        )

    @admin.action(
        description="Mark the selected prices' versions free (a zero price, as soon as allowed)",
        permissions=["operate"],
    )
    def mark_free(self, request: HttpRequest, queryset: QuerySet[Price]) -> None:
        versions = sorted(set(queryset.values_list("model_version_id", flat=True)))
        for version_id in versions:
            try:
                price = price_set(
                    model_version_id=version_id,
                    input_per_million=Decimal(0),
                    cached_input_per_million=Decimal(0),
                    output_per_million=Decimal(0),
                    actor=request.user.get_username(),
                )
            except ValidationError as error:
                messages.error(request, f"Version {version_id}: {' '.join(error.messages)}")
            else:
                messages.success(request, f"Free: {price}.")


# Accounts, movements and top-ups ---------------------------------------------------------------


class TopUpForm(forms.Form):
    amount = forms.DecimalField(
        max_digits=16, decimal_places=6, min_value=Decimal("0.000001"), help_text="Credited."
    )
    note = forms.CharField(max_length=255, required=False, help_text="Why, for the ledger.")
    # Sent again (a double click, a reload), the form tops up once: top_up's idempotency key.
    once = forms.CharField(widget=forms.HiddenInput, validators=[NONCE])


@admin.register(BillingAccount)
class BillingAccountAdmin(OperatorActions, admin.ModelAdmin):
    """A tenant's mode, alert settings and balance; the balance moves only by movements (a
    top-up here, redemptions, usage charges), never by editing it."""

    list_display = [
        "tenant",
        "mode",
        "balance",
        "low_balance_threshold",
        "notify_email",
        "webhook_url",
        "updated_at",
    ]
    list_filter = ["mode"]
    search_fields = ["tenant__name", "tenant__slug"]
    list_select_related = ["tenant"]
    autocomplete_fields = ["tenant"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    fields = [
        "tenant",
        "mode",
        "balance",
        "low_balance_threshold",
        "notify_email",
        "webhook_url",
        "budgets_now",
        "recent_movements",
    ]
    actions = ["top_up"]

    def get_readonly_fields(self, request: HttpRequest, obj: BillingAccount | None = None):
        shown = ["balance", "budgets_now", "recent_movements"]
        return ["tenant", *shown] if obj else shown

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # its movements are the ledger

    def save_model(self, request: HttpRequest, obj: BillingAccount, form, change: bool) -> None:
        # Under the account's lock, from its row as it is now: a save of the form's copy would
        # write back a balance that a charge or a credit may have moved since it was read.
        with transaction.atomic():
            account = account_update(
                account=account_of(obj.tenant_id, lock=True),
                mode=obj.mode,
                low_balance_threshold=obj.low_balance_threshold,
                notify_email=obj.notify_email,
                webhook_url=obj.webhook_url,
            )
        obj.pk, obj.balance = account.pk, account.balance

    @admin.display(description="Budgets this period")
    def budgets_now(self, account: BillingAccount) -> str:
        if account.pk is None:
            return "-"
        try:
            statuses = budget_status(account.tenant_id)
        except RedisError as error:  # the counters live in Redis; the page does not need them
            logger.warning("account page without budget spend: %s", error)
            return "Unavailable (Redis)."
        if not statuses:
            return "None."
        return format_html_join(
            "",
            "<div>{}: {} of {} ({}), until {}</div>",
            (
                (
                    f"key {s.budget.api_key_id}" if s.budget.api_key_id else "tenant",
                    _money(s.spent),
                    _money(s.budget.amount),
                    "hard" if s.budget.hard else "soft",
                    f"{s.resets_at:%Y-%m-%d %H:%M} UTC",
                )
                for s in statuses
            ),
        )

    @admin.display(description="Recent movements")
    def recent_movements(self, account: BillingAccount) -> str:
        if account.pk is None:
            return "-"
        movements = movements_of(account.tenant_id)[:RECENT_MOVEMENTS]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    f"{m.created_at:%Y-%m-%d %H:%M:%S}",
                    m.get_kind_display(),
                    f"{m.amount:.6f}",
                    f"{m.balance_after:.6f}",
                    m.note,
                    m.actor,
                )
                for m in movements
            ),
        )
        everything = reverse("admin:billing_balancemovement_changelist")
        return format_html(
            "<table><tr><th>When</th><th>Kind</th><th>Amount</th><th>Balance after</th>"
            '<th>Note</th><th>By</th></tr>{}</table><a href="{}?account__id__exact={}">'
            "Every movement</a>",
            rows,
            everything,
            account.pk,
        )

    def get_urls(self):
        top_up_page = path(
            "<path:object_id>/top-up/",
            self.admin_site.admin_view(self.top_up_view),
            name="billing_billingaccount_top_up",
        )
        return [top_up_page, *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url="", extra_context=None):
        can_top_up = self.has_operate_permission(request)
        extra_context = {**(extra_context or {}), "can_top_up": can_top_up}
        return super().change_view(request, object_id, form_url, extra_context)

    def top_up_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Credit an amount to the account's balance: a top-up movement, audited."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        account = self.get_object(request, object_id)
        if account is None:
            raise Http404
        form = TopUpForm(request.POST or None, initial={"once": uuid.uuid4().hex})
        if request.method == "POST" and form.is_valid():
            try:
                movement = top_up(
                    tenant_id=account.tenant_id,
                    amount=form.cleaned_data["amount"],
                    actor=request.user.get_username(),
                    key=f"admin:{form.cleaned_data['once']}",
                    note=form.cleaned_data["note"],
                )
            except ValidationError as error:
                _errors_to_form(form, error)
            else:
                messages.success(
                    request,
                    f"Topped up {_money(movement.amount)} for {account.tenant}: the balance is "
                    f"{_money(movement.balance_after)}.",
                )
                return HttpResponseRedirect(
                    reverse("admin:billing_billingaccount_change", args=[account.pk])
                )
        return _form_page(
            self,
            request,
            f"Top up {account.tenant}",
            form,
            "admin/billing/billingaccount/top_up.html",
            account=account,
            balance=_money(account.balance),
        )

    @admin.action(description="Top up the selected account", permissions=["operate"])
    def top_up(self, request: HttpRequest, queryset: QuerySet[BillingAccount]):
        if queryset.count() != 1:
            messages.warning(request, "Select one account to top up.")
            return None
        account = queryset.get()
        return HttpResponseRedirect(
            reverse("admin:billing_billingaccount_top_up", args=[account.pk])
        )


@admin.register(BalanceMovement)
class BalanceMovementAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The balance ledger: written by top-ups, redemptions and the usage flush only."""

    list_display = [
        "created_at",
        "account",
        "kind",
        "amount",
        "balance_after",
        "note",
        "actor",
        "idempotency_key",
    ]
    list_filter = ["kind"]
    search_fields = ["account__tenant__name", "idempotency_key", "note"]
    date_hierarchy = "created_at"
    list_select_related = ["account__tenant"]


# Budgets ---------------------------------------------------------------------------------------


class BudgetForm(forms.ModelForm):
    class Meta:
        model = Budget
        fields = ["tenant", "api_key", "period", "amount", "hard", "locked"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is None:
            # An operator's budget is a limit the tenant's owners live within, unless unticked.
            self.fields["locked"].initial = True

    def clean(self) -> dict:
        data = super().clean()
        tenant, key = data.get("tenant"), data.get("api_key")
        if tenant is not None and key is not None and key.tenant_id != tenant.id:
            self.add_error("api_key", "A key of this tenant, or none for the whole tenant.")
        return data


@admin.register(Budget)
class BudgetAdmin(OperatorActions, ServiceDeletesMixin, admin.ModelAdmin):
    """Every change goes through budget_set and budget_delete, which tell the gateways."""

    form = BudgetForm
    list_display = ["tenant", "api_key", "period", "amount", "hard", "locked", "created_at"]
    list_filter = ["period", "hard", "locked"]
    search_fields = ["tenant__name", "tenant__slug"]
    list_select_related = ["tenant", "api_key"]
    autocomplete_fields = ["tenant", "api_key"]

    def get_readonly_fields(self, request: HttpRequest, obj: Budget | None = None) -> list[str]:
        # A budget is its owner's and its period's: another owner or period is another budget.
        return ["tenant", "api_key", "period", "spent"] if obj else []

    def get_fields(self, request: HttpRequest, obj: Budget | None = None) -> list[str]:
        fields = ["tenant", "api_key", "period", "amount", "hard", "locked"]
        return [*fields, "spent"] if obj else fields

    @admin.display(description="Spent this period")
    def spent(self, budget: Budget) -> str:
        try:
            statuses = budget_status(budget.tenant_id)
        except RedisError as error:
            logger.warning("budget page without its spend: %s", error)
            return "Unavailable (Redis)."
        found = next((s for s in statuses if s.budget.id == budget.id), None)
        if found is None:
            return "-"
        return f"{_money(found.spent)} until {found.resets_at:%Y-%m-%d %H:%M} UTC"

    def save_model(self, request: HttpRequest, obj: Budget, form, change: bool) -> None:
        budget = budget_set(
            tenant_id=obj.tenant_id,
            api_key_id=obj.api_key_id,
            period=obj.period,
            amount=obj.amount,
            hard=obj.hard,
            locked=obj.locked,
        )
        obj.pk, obj.created_at = budget.pk, budget.created_at

    def delete_row(self, obj: Budget) -> None:
        budget_delete(budget=obj, operator=True)


# Redemption codes ------------------------------------------------------------------------------


class BatchForm(forms.Form):
    face_value = forms.DecimalField(
        max_digits=16,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        help_text="What each code credits, in the platform's currency.",
    )
    count = forms.IntegerField(min_value=1, max_value=MAX_BATCH, help_text="Codes to make.")
    expires_at = forms.SplitDateTimeField(
        widget=AdminSplitDateTime, required=False, help_text="Empty: they never expire."
    )
    note = forms.CharField(max_length=255, required=False, help_text="What they are for.")
    once = forms.CharField(widget=forms.HiddenInput, validators=[NONCE])

    def clean_expires_at(self):
        moment = self.cleaned_data["expires_at"]
        if moment is not None and moment <= timezone.now():
            raise forms.ValidationError("A moment in the future.")
        return moment


def codes_csv(batch: RedemptionBatch, codes: list[str]) -> str:
    """The batch's codes as CSV: one row per code with its value and expiry."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["code", "face_value", "currency", "expires_at", "batch"])
    expires = batch.expires_at.isoformat() if batch.expires_at else ""
    for code in codes:
        writer.writerow([code, f"{batch.face_value:.6f}", settings.DMX_CURRENCY, expires, batch.pk])
    return out.getvalue()


@admin.register(RedemptionBatch)
class RedemptionBatchAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Batches of codes: generated on the add page, whose answer shows the codes and offers
    them as CSV this once (they are stored only as HMACs); read-only afterwards."""

    list_display = [
        "created_at",
        "face_value",
        "count",
        "redeemed",
        "expires_at",
        "note",
        "created_by",
    ]
    search_fields = ["note", "created_by"]
    date_hierarchy = "created_at"
    readonly_fields = ["redeemed", "codes_link"]
    fields = [
        "face_value",
        "count",
        "redeemed",
        "expires_at",
        "note",
        "created_by",
        "created_at",
        "codes_link",
    ]
    console_refuses = ("change", "delete")  # codes out there are worth money

    def get_queryset(self, request: HttpRequest) -> QuerySet[RedemptionBatch]:
        return batches_with_counts()

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> list[str]:
        return [*self.fields]

    @admin.display(description="Redeemed")
    def redeemed(self, batch: RedemptionBatch) -> int:
        return batch.redeemed

    @admin.display(description="Codes")
    def codes_link(self, batch: RedemptionBatch) -> str:
        url = reverse("admin:billing_redemptioncode_changelist")
        return format_html('<a href="{}?batch__id__exact={}">Its codes</a>', url, batch.pk)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context=None):
        """Generate a batch; the answer is the only page that ever shows its codes."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = BatchForm(request.POST or None, initial={"once": uuid.uuid4().hex})
        if request.method == "POST" and form.is_valid():
            sent = request.session.get(SENT_FORMS, [])
            once = form.cleaned_data["once"]
            if once in sent:
                messages.warning(
                    request,
                    "This form was sent already: its codes were shown then, and are not again.",
                )
                return HttpResponseRedirect(reverse("admin:billing_redemptionbatch_changelist"))
            try:
                batch, codes = codes_generate(
                    face_value=form.cleaned_data["face_value"],
                    count=form.cleaned_data["count"],
                    expires_at=form.cleaned_data["expires_at"],
                    note=form.cleaned_data["note"],
                    actor=request.user.get_username(),
                )
            except ValueError as error:
                form.add_error(None, str(error))
            else:
                request.session[SENT_FORMS] = [*sent, once][-SENT_FORMS_KEPT:]
                return self._codes_page(request, batch, codes)
        return _form_page(
            self,
            request,
            "Generate redemption codes",
            form,
            "admin/billing/redemptionbatch/generate.html",
            media=form.media,
        )

    def _codes_page(self, request: HttpRequest, batch: RedemptionBatch, codes: list[str]):
        encoded = base64.b64encode(codes_csv(batch, codes).encode()).decode()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"The codes of batch {batch.pk}",
            "batch": batch,
            "codes": codes,
            "face_value": _money(batch.face_value),
            "csv_href": f"data:text/csv;charset=utf-8;base64,{encoded}",
            "csv_name": f"redemption-codes-{batch.pk}.csv",
        }
        response = TemplateResponse(request, "admin/billing/redemptionbatch/codes.html", context)
        response["Cache-Control"] = NOT_STORED
        return response


@admin.register(RedemptionCode)
class RedemptionCodeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Codes by their last characters (the codes themselves are not kept)."""

    list_display = ["__str__", "batch", "redeemed_by", "redeemed_at"]
    list_filter = [("redeemed_at", admin.EmptyFieldListFilter), "batch"]
    search_fields = ["hint"]
    list_select_related = ["batch", "redeemed_by"]
    fields = ["batch", "hint", "redeemed_by", "redeemed_at"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Budget and balance alerts, one per subject and period, with how their sending went."""

    list_display = [
        "created_at",
        "tenant",
        "kind",
        "subject",
        "period",
        "email_sent_at",
        "webhook_sent_at",
        "attempts",
    ]
    list_filter = ["kind"]
    search_fields = ["tenant__name", "subject"]
    list_select_related = ["tenant"]


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "request_id",
        "created_at",
        "tenant",
        "api_key",
        "model",
        "intent",
        "intent_confidence",
        "node",
        "status",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost",
        "duration_ms",
    ]
    list_filter = ["status", "model", "intent", "intent_low_confidence", "stream"]
    search_fields = ["request_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "api_key"]
    readonly_fields = ["trace"]

    @admin.display(description="Trace")
    def trace(self, record: UsageRecord) -> str:
        return request_trace_link(record.request_id)


@admin.register(UsageDaily)
class UsageDailyAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "day",
        "tenant",
        "api_key",
        "model",
        "requests",
        "errors",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost",
    ]
    list_filter = ["model", "tenant"]
    date_hierarchy = "day"
    list_select_related = ["tenant", "api_key"]
