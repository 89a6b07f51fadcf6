from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.keys.models import ApiKey, Tenant, UsageRecord
from apps.keys.services import api_key_create, api_key_revoke, api_key_update


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "is_active", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["members"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "display_prefix", "tenant", "expires_at", "revoked_at", "created_at"]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "key_id", "tenant__name"]
    readonly_fields = ["display_prefix", "created_by", "revoked_at", "created_at"]
    actions = ["revoke"]

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        fields = ["tenant", "name", "allowed_models", "expires_at"]
        return fields if obj is None else ["display_prefix", *fields, *self.readonly_fields[1:]]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        return [*self.readonly_fields, "tenant"] if obj else []

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            api_key_update(key=obj)
            return
        key, plaintext = api_key_create(
            tenant=obj.tenant,
            name=obj.name,
            created_by=request.user,
            allowed_models=obj.allowed_models,
            expires_at=obj.expires_at,
        )
        obj.pk, obj.key_id = key.pk, key.key_id
        messages.warning(request, f"The key's secret, shown this once; copy it now: {plaintext}")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            api_key_revoke(key=key)
        messages.success(request, f"Revoked {queryset.count()} key(s).")

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # usage records refer to keys forever; revoke instead


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "request_id",
        "created_at",
        "tenant",
        "api_key",
        "model",
        "node",
        "status",
        "prompt_tokens",
        "completion_tokens",
        "duration_ms",
    ]
    list_filter = ["status", "model", "stream"]
    search_fields = ["request_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "api_key"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
