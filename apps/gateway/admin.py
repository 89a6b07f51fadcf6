from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from apps.gateway.choices import SensitiveTermAction
from apps.gateway.models import SensitiveTerm, StoredResponse
from apps.gateway.services import (
    sensitive_term_bulk_delete,
    sensitive_term_bulk_set_active,
    sensitive_term_create,
    sensitive_term_delete,
    sensitive_term_update,
    sensitive_terms_import_csv,
)
from apps.gateway.terms_csv import COLUMNS, MAX_CSV_BYTES, write_terms
from dmxplatform.admin import OperatorActions

# Bad rows listed after an import, one message each; the rest are counted.
BAD_ROWS_SHOWN = 20


class TermsCsvForm(forms.Form):
    file = forms.FileField(
        help_text=f"CSV, UTF-8: {', '.join(COLUMNS)} per row (the header is optional; an empty "
        "category is default, an empty action block). Terms stored already are kept as they are."
    )


def terms_csv_response(terms: QuerySet[SensitiveTerm]) -> HttpResponse:
    response = HttpResponse(write_terms(terms), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="sensitive-terms.csv"'
    return response


@admin.register(SensitiveTerm)
class SensitiveTermAdmin(OperatorActions, admin.ModelAdmin):
    """Every change goes through a service, which tells the gateways to reload their filter."""

    list_display = ["term", "category", "action", "is_active", "updated_at"]
    list_filter = ["category", "action", "is_active"]
    search_fields = ["term", "category"]
    list_editable = ["action", "is_active"]
    readonly_fields = ["created_at", "updated_at"]
    actions = ["activate", "deactivate", "export_csv"]
    change_list_template = "admin/gateway/sensitiveterm/change_list.html"

    def get_urls(self):
        pages = [
            path(
                "import/",
                self.admin_site.admin_view(self.import_view),
                name="gateway_sensitiveterm_import",
            ),
            path(
                "export/",
                self.admin_site.admin_view(self.export_view),
                name="gateway_sensitiveterm_export",
            ),
        ]
        return pages + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_operate": self.has_operate_permission(request),
        }
        return super().changelist_view(request, extra_context)

    def import_view(self, request: HttpRequest) -> HttpResponse:
        """Upload a CSV of terms: the good rows are imported, each bad one reported."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        form = TermsCsvForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            # One byte over the limit is enough for the service to refuse the file.
            report = sensitive_terms_import_csv(data=upload.read(MAX_CSV_BYTES + 1))
            messages.success(
                request,
                f"Imported {len(report.created)} term(s); {report.already_stored} stored already.",
            )
            for error in report.errors[:BAD_ROWS_SHOWN]:
                messages.warning(request, f"Not imported, {error}")
            if len(report.errors) > BAD_ROWS_SHOWN:
                messages.warning(
                    request, f"… and {len(report.errors) - BAD_ROWS_SHOWN} more bad rows."
                )
            return HttpResponseRedirect(reverse("admin:gateway_sensitiveterm_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Import sensitive terms",
            "form": form,
        }
        return TemplateResponse(request, "admin/gateway/sensitiveterm/import.html", context)

    def export_view(self, request: HttpRequest) -> HttpResponse:
        """Every term as CSV, in the format the import reads."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        return terms_csv_response(SensitiveTerm.objects.all())

    @admin.action(description="Export selected terms as CSV", permissions=["operate"])
    def export_csv(self, request: HttpRequest, queryset: QuerySet[SensitiveTerm]) -> HttpResponse:
        return terms_csv_response(queryset)

    def save_model(self, request: HttpRequest, obj: SensitiveTerm, form, change: bool) -> None:
        if change:
            sensitive_term_update(sensitive_term=obj)
            return
        created = sensitive_term_create(
            term=obj.term,
            category=obj.category,
            action=SensitiveTermAction(obj.action),
            is_active=obj.is_active,
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


@admin.register(StoredResponse)
class StoredResponseAdmin(admin.ModelAdmin):
    """Stored responses, read only: a tenant deletes its own through the API, which removes the
    gateway's Redis copy too (a row deleted here would still be served from it)."""

    list_display = ("id", "tenant", "status", "model", "background", "created_at", "size_bytes")
    list_filter = ("status", "background")
    search_fields = ("=id", "=previous_response_id")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
