"""The operator console's site: Django's admin with the platform's own pages beside the models.

Installed in place of django.contrib.admin (config.apps.PlatformAdminConfig), so every app's
`@admin.register` lands here; pages that show no model (parked stream entries, the fleet
dashboard, request traces) are added in get_urls and listed on the index in a "Platform"
section.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from apps.console import dashboard, trace
from dmxplatform import streams

# Parked entries listed per stream: a page an operator reads, not an export.
PARKED_SHOWN = 200
# Characters of an entry's payload shown in the list.
PAYLOAD_PREVIEW_CHARS = 300
ENTRY_ID = re.compile(r"\d+-\d+")


class PlatformAdminSite(admin.AdminSite):
    site_header = "DMX platform"
    site_title = "DMX platform"
    index_title = "Operator console"

    def get_urls(self):
        pages = [
            path(
                "platform/parked/",
                self.admin_view(self.parked_view),
                name="platform_parked",
            ),
            path(
                "platform/fleet/",
                self.admin_view(dashboard.fleet_dashboard_view),
                name="console_fleet_dashboard",
            ),
            path(
                "platform/traces/",
                self.admin_view(trace.trace_search_view),
                name="console_trace_search",
            ),
            path(
                "platform/traces/<str:request_id>/",
                self.admin_view(trace.trace_detail_view),
                name="console_trace",
            ),
        ]
        return pages + super().get_urls()

    def get_app_list(self, request: HttpRequest, app_label: str | None = None):
        apps = super().get_app_list(request, app_label)
        if app_label is None and request.user.is_active and request.user.is_staff:
            apps.insert(
                0,
                {
                    "name": "Platform",
                    "app_label": "platform",
                    "app_url": reverse("admin:platform_parked"),
                    "has_module_perms": True,
                    "models": [
                        {
                            "name": "Parked stream entries",
                            "object_name": "parked",
                            "admin_url": reverse("admin:platform_parked"),
                            "view_only": True,
                        },
                        {
                            "name": "Fleet dashboard",
                            "object_name": "fleet",
                            "admin_url": reverse("admin:console_fleet_dashboard"),
                            "view_only": True,
                        },
                        {
                            "name": "Request traces",
                            "object_name": "traces",
                            "admin_url": reverse("admin:console_trace_search"),
                            "view_only": True,
                        },
                    ],
                },
            )
        return apps

    def parked_view(self, request: HttpRequest) -> HttpResponse:
        """Entries of the durable streams that could never be stored, with why; a superuser
        can put them back on their stream (once the cause is fixed) or discard them."""
        if request.method == "POST":
            return self._parked_act(request)
        sections = []
        for stream in streams.every_shard():
            entries = streams.parked(stream, count=PARKED_SHOWN)
            sections.append(
                {
                    "stream": stream,
                    "count": streams.parked_count(stream),
                    "entries": [
                        {
                            "id": entry.id.decode(),
                            "original_id": entry.original_id,
                            "reason": entry.reason,
                            "parked_at": datetime.fromtimestamp(entry.parked_at, tz=UTC),
                            "payload": entry.payload[:PAYLOAD_PREVIEW_CHARS].decode(
                                errors="backslashreplace"
                            ),
                        }
                        for entry in entries
                    ],
                }
            )
        context = {
            **self.each_context(request),
            "title": "Parked stream entries",
            "sections": sections,
            "can_act": request.user.is_superuser,
        }
        return TemplateResponse(request, "admin/platform/parked.html", context)

    def _parked_act(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_superuser:
            raise PermissionDenied
        stream = streams.shard_named(request.POST.get("stream", ""))
        if stream is None:
            raise Http404("no such stream")
        action = request.POST.get("action", "")
        # A stream entry id is "<ms>-<seq>"; anything else would make Redis answer an error.
        ids = [e.encode() for e in request.POST.getlist("entry") if ENTRY_ID.fullmatch(e)]
        if action.endswith("_all"):
            ids = None
        if action.startswith("requeue"):
            moved = streams.parked_requeue(stream, ids)
            messages.success(request, f"{moved} entries put back on {stream.title}.")
        elif action.startswith("discard"):
            gone = streams.parked_discard(stream, ids)
            messages.warning(request, f"{gone} parked entries of {stream.title} discarded.")
        return HttpResponseRedirect(reverse("admin:platform_parked"))
