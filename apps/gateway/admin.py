from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.gateway.models import SensitiveTerm
from apps.gateway.services import (
    sensitive_term_bulk_delete,
    sensitive_term_bulk_set_active,
    sensitive_term_create,
    sensitive_term_delete,
    sensitive_term_update,
)
from dmxplatform.admin import OperatorActions


@admin.register(SensitiveTerm)
class SensitiveTermAdmin(OperatorActions, admin.ModelAdmin):
    """Every change goes through a service, which tells the gateways to reload their filter."""

    list_display = ["term", "category", "action", "is_active", "updated_at"]
    list_filter = ["category", "action", "is_active"]
    search_fields = ["term", "category"]
    list_editable = ["action", "is_active"]
    readonly_fields = ["created_at", "updated_at"]
    actions = ["activate", "deactivate"]

    def save_model(self, request: HttpRequest, obj: SensitiveTerm, form, change: bool) -> None:
        if change:
            sensitive_term_update(sensitive_term=obj)
            return
        created = sensitive_term_create(
            term=obj.term, category=obj.category, action=obj.action, is_active=obj.is_active
        )
        obj.pk, obj.term = created.pk, created.term

    def delete_model(self, request: HttpRequest, obj: SensitiveTerm) -> None:
        sensitive_term_delete(sensitive_term=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SensitiveTerm]) -> None:
        sensitive_term_bulk_delete(queryset=queryset)

    @admin.action(description="Activate selected terms", permissions=["operate"])
    def activate(self, request: HttpRequest, queryset: QuerySet[SensitiveTerm]) -> None:
        changed = sensitive_term_bulk_set_active(queryset=queryset, is_active=True)
        messages.success(request, f"Activated {changed} term(s).")

    @admin.action(description="Deactivate selected terms", permissions=["operate"])
    def deactivate(self, request: HttpRequest, queryset: QuerySet[SensitiveTerm]) -> None:
        changed = sensitive_term_bulk_set_active(queryset=queryset, is_active=False)
        messages.success(request, f"Deactivated {changed} term(s).")
