from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from apps.billing.selectors import account_find, statement_of
from apps.keys.models import ApiKey, ManagementToken, Membership, Plan, PlanQuota, Tenant
from apps.keys.services import (
    api_key_create,
    api_key_revoke,
    api_key_signing_enable,
    api_key_update,
    management_token_revoke,
    management_token_update,
    plan_delete,
    plan_edit,
    tenant_approve,
    tenant_update,
)
from dmxplatform.admin import (
    OperatorActions,
    ReadOnlyAdminMixin,
    ServiceDeletesMixin,
)

LIMIT_FIELDS = ["requests_per_minute", "tokens_per_minute", "max_concurrent_requests"]


class PlanQuotaInline(admin.TabularInline):
    model = PlanQuota
    extra = 0


@admin.register(Plan)
class PlanAdmin(ServiceDeletesMixin, admin.ModelAdmin):
    list_display = ["name", *LIMIT_FIELDS, "price_multiplier"]
    inlines = [PlanQuotaInline]

    def save_model(self, request: HttpRequest, obj: Plan, form, change: bool) -> None:
        """Saved with its quotas, in save_related: the gateways learn the plan once, whole."""

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        saved, deleted = [], []
        for formset in formsets:  # the quotas' inline
            saved += formset.save(commit=False)
            deleted += formset.deleted_objects
        plan_edit(plan=form.instance, quotas_saved=saved, quotas_deleted=deleted)
        form.save_m2m()
        for formset in formsets:
            formset.save_m2m()

    def delete_row(self, obj: Plan) -> None:
        plan_delete(plan=obj)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ApprovalFilter(admin.SimpleListFilter):
    title = "approval"
    parameter_name = "approval"

    def lookups(self, request: HttpRequest, model_admin) -> list[tuple[str, str]]:
        return [("pending", "Waiting for approval"), ("approved", "Approved")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> QuerySet[Tenant]:
        if self.value() == "pending":
            return queryset.filter(approved_at__isnull=True)
        if self.value() == "approved":
            return queryset.filter(approved_at__isnull=False)
        return queryset


@admin.register(Tenant)
class TenantAdmin(OperatorActions, admin.ModelAdmin):
    list_display = ["name", "slug", "plan", "is_active", "approved_at", "created_at"]
    list_filter = [ApprovalFilter, "plan", "is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["approved_at", "billing"]
    inlines = [MembershipInline]
    actions = ["approve"]

    @admin.display(description="Billing")
    def billing(self, tenant: Tenant) -> str:
        """Its mode, balance and spend this month, and where to change them."""
        if tenant.pk is None:
            return "-"
        account = account_find(tenant.id)
        spent = statement_of(tenant_id=tenant.id, month=timezone.now().date()).total
        currency = settings.DMX_CURRENCY
        if account is None:
            url = reverse("admin:billing_billingaccount_add") + f"?tenant={tenant.id}"
            return format_html(
                'Postpaid, no account yet; {} {} spent this month. <a href="{}">Set up</a>',
                f"{spent:.6f}",
                currency,
                url,
            )
        url = reverse("admin:billing_billingaccount_change", args=[account.pk])
        return format_html(
            '{}, balance {} {}; {} {} spent this month. <a href="{}">Account, top-ups</a>',
            account.get_mode_display(),
            f"{account.balance:.6f}",
            currency,
            f"{spent:.6f}",
            currency,
            url,
        )

    @admin.action(description="Approve the selected tenants", permissions=["operate"])
    def approve(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        approved = [tenant_approve(tenant=t) for t in queryset.filter(approved_at__isnull=True)]
        self.message_user(request, f"Approved {len(approved)} tenant(s).", messages.SUCCESS)

    def save_model(self, request: HttpRequest, obj: Tenant, form, change: bool) -> None:
        # A plan or a suspension: its keys must learn it (the API's way too).
        tenant_update(tenant=obj)


@admin.register(ApiKey)
class ApiKeyAdmin(OperatorActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "display_prefix",
        "tenant",
        "priority",
        "signing_required",
        "expires_at",
        "revoked_at",
        "created_at",
    ]
    list_filter = [
        "tenant",
        "priority",
        "signing_required",
        ("revoked_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["name", "key_id", "tenant__name"]
    actions = ["revoke"]
    console_refuses = ("delete",)  # usage records refer to keys forever; revoke instead
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "display_prefix",
                    "tenant",
                    "name",
                    "created_by",
                    "created_at",
                    "revoked_at",
                ]
            },
        ),
        (
            "Access",
            {
                "fields": [
                    "allowed_models",
                    "allowed_networks",
                    "expires_at",
                    "priority",
                    "signing_required",
                ]
            },
        ),
        (
            "Limits (within the tenant's plan)",
            {"fields": [*LIMIT_FIELDS, "token_quota", "token_quota_period"]},
        ),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        shown = ["display_prefix", "created_by", "created_at", "revoked_at"]
        # Signing is switched on through the service, which issues the secret; never off silently.
        return [*shown, "tenant", "signing_required"] if obj else shown

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            api_key_update(key=obj)
            return
        fields = {
            name: form.cleaned_data[name]
            for name in form.cleaned_data
            if name != "signing_required"
        }
        key, plaintext = api_key_create(created_by=request.user, **fields)
        obj.pk, obj.key_id = key.pk, key.key_id
        messages.warning(request, f"The key's secret, shown this once; copy it now: {plaintext}")
        if form.cleaned_data.get("signing_required"):
            signing = api_key_signing_enable(key=key)
            messages.warning(request, f"The key's signing secret, shown this once: {signing}")

    @admin.action(description="Revoke selected keys", permissions=["operate"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            api_key_revoke(key=key)
        messages.success(request, f"Revoked {queryset.count()} key(s).")


# The ledger is written by the platform only.


@admin.register(ManagementToken)
class ManagementTokenAdmin(OperatorActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "name",
        "display_prefix",
        "user",
        "tenant",
        "scope",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["scope", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "token_id", "user__email", "tenant__name"]
    readonly_fields = ["display_prefix", "last_used_at", "created_at"]
    fields = [
        "display_prefix",
        "name",
        "user",
        "tenant",
        "scope",
        "expires_at",
        "revoked_at",
        "last_used_at",
        "created_at",
    ]
    actions = ["revoke"]
    console_refuses = ("add",)  # created in the portal, where the secret is shown once

    def save_model(self, request: HttpRequest, obj: ManagementToken, form, change: bool) -> None:
        management_token_update(token=obj)

    @admin.action(description="Revoke the selected tokens", permissions=["operate"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ManagementToken]) -> None:
        for token in queryset:
            management_token_revoke(token=token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)
