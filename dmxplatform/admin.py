"""What every app's admin shares: who may run the actions that change the platform, rows the
console never edits, deletes through a service, and links to a request's trace. The site itself
(the console's own pages) is the composition root's: config.admin.
"""

from __future__ import annotations

from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html


class OperatorActions:
    """For a ModelAdmin whose actions change the platform (revoke, drain, approve, promote):
    each declares `permissions=["operate"]`, so that it runs only for users who may change the
    model, never for a viewer, who may look at everything and change nothing. (An action that
    declares no permission runs for anyone who can see the list.) The model's change
    permission decides, not the admin's has_change_permission, which read-only pages turn off
    for their edit forms while their actions stay an operator's."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")


class ReadOnlyAdminMixin:
    """For a ModelAdmin of rows the platform writes itself (the ledger, the logs, what workers
    report): nobody adds, changes or deletes one in the console, superusers included; whoever
    may view them still does. An admin that allows some of the three keeps only the others in
    `console_refuses`; the user's permissions decide those it allows, as without the mixin."""

    console_refuses: tuple[str, ...] = ("add", "change", "delete")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return "add" not in self.console_refuses and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return "change" not in self.console_refuses and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return "delete" not in self.console_refuses and super().has_delete_permission(request, obj)


class ServiceDeletesMixin:
    """For a ModelAdmin whose rows are deleted through their app's service (which tells the
    gateways, or checks that the row may go): the delete page and the list's "delete selected"
    both call `delete_row`, so that neither deletes around it."""

    def delete_row(self, obj: Model) -> None:
        raise NotImplementedError

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        self.delete_row(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for obj in queryset:
            self.delete_row(obj)


def request_trace_link(request_id: str) -> str:
    """A link to a request's trace page, for the admin pages of what it left behind."""
    url = reverse("admin:console_trace", args=[request_id])
    return format_html('<a href="{}">stages, routing and usage of {}</a>', url, request_id)
