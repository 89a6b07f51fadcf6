"""The audit log in the console: auditlog's own view, for reading only, by everyone.

Both roles may see it (keys/0007 gives them the view permission); nobody, superusers included,
adds, changes or deletes an entry here: the log is evidence.
"""

from __future__ import annotations

from auditlog.admin import LogEntryAdmin
from auditlog.models import LogEntry
from django.contrib import admin

from dmxplatform.admin import ReadOnlyAdminMixin

admin.site.unregister(LogEntry)


@admin.register(LogEntry)
class AuditLogEntryAdmin(ReadOnlyAdminMixin, LogEntryAdmin):
    """Auditlog's view with deleting refused too: auditlog's allows it as a cascade from
    elsewhere, and none cascades here (an actor's deletion sets the entry's actor to null)."""

    # Besides auditlog's (the object, the changes, the actor's names): the actor's address,
    # also as it was when they acted (actor_email outlives the user), and the object's id.
    search_fields = [*LogEntryAdmin.search_fields, "actor__email", "actor_email", "object_pk"]
    readonly_fields = [*LogEntryAdmin.readonly_fields, "remote_addr", "additional_data"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "created",
                    "user_url",
                    "resource_url",
                    "cid",
                    "remote_addr",
                    # Which management token acted, for calls of the management API.
                    "additional_data",
                ]
            },
        ),
        ("Changes", {"fields": ["action", "msg"]}),
    ]
