from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from apps.batches.choices import ENDED
from apps.batches.models import Batch, File
from apps.batches.services import batch_cancel
from apps.billing.selectors import usage_of_batches
from dmxplatform.admin import OperatorActions, ReadOnlyAdminMixin
from dmxplatform.errors import ApplicationError


@admin.register(Batch)
class BatchAdmin(OperatorActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Tenants' batches: their progress, and the nodes that ran them. An operator may cancel
    one (as its tenant would: lines running finish, the rest are not run)."""

    list_display = ("id", "tenant", "status", "endpoint", "model", "progress", "created_at")
    list_filter = ("status", "endpoint")
    search_fields = ("=id", "tenant__name")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"
    show_full_result_count = False
    actions = ["cancel"]
    readonly_fields = ("node_share",)

    @admin.display(description="done")
    def progress(self, batch: Batch) -> str:
        return f"{batch.completed + batch.failed} / {batch.total} ({batch.failed} failed)"

    @admin.display(description="nodes that ran it")
    def node_share(self, batch: Batch) -> str:
        nodes = usage_of_batches(batch_ids=[batch.id]).get(batch.id, {})
        total = sum(row["requests"] for row in nodes.values()) or 1
        return (
            format_html_join(
                "",
                "<div>{}: {} requests ({}%), {} + {} tokens, {}</div>",
                (
                    (
                        node,
                        row["requests"],
                        round(100 * row["requests"] / total),
                        row["prompt_tokens"],
                        row["completion_tokens"],
                        row["cost"],
                    )
                    for node, row in nodes.items()
                ),
            )
            or "-"
        )

    @admin.action(description="Cancel the selected batches", permissions=["operate"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        cancelled = 0
        for batch in queryset.exclude(status__in=ENDED):
            try:
                batch_cancel(batch.id, batch.tenant_id)
            except ApplicationError as error:
                self.message_user(request, f"{batch.id}: {error}", messages.WARNING)
            else:
                cancelled += 1
        self.message_user(request, f"{cancelled} batch(es) cancelling.")


@admin.register(File)
class FileAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "tenant", "purpose", "filename", "bytes", "created_at", "expires_at")
    list_filter = ("purpose",)
    search_fields = ("=id", "filename")
    list_select_related = ("tenant",)
    show_full_result_count = False
