"""Audit entries that auditlog's signals and middleware cannot make by themselves.

queryset.update() and bulk_create() send no model signals, so the services that use them log
their rows here, as a save would have (in one insert of entries, not one per row); and a view
that authenticates by itself (the management API's tokens, in DRF) names its actor with
`acting`, since the middleware saw nobody.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from auditlog.context import auditlog_disabled, auditlog_value, set_extra_data
from auditlog.diff import model_instance_diff
from auditlog.models import LogEntry, LogEntryManager
from django.conf import settings
from django.db import router, transaction
from django.db.models import Model, QuerySet
from django.db.models.signals import pre_save

M = TypeVar("M", bound=Model)

# Entries per INSERT: a statement of some megabytes at most, and, at LogEntry's 15 columns,
# under PostgreSQL's 65,535 parameters should the database use server-side binding.
ENTRY_BATCH_SIZE = 2000


def hide_secret(value: str) -> str:
    """Mask a secret's hash whole (auditlog's mask_callable): an entry shows that it changed."""
    return "" if value in ("", "None") else "(hidden)"


@contextmanager
def acting(*, actor, **fields: Any) -> Iterator[None]:
    """Name the actor of the changes made inside, and LogEntry `fields` (additional_data);
    the remote address and correlation id stay the middleware's."""
    outer = auditlog_value.get(None)
    inherited = {k: v for k, v in (outer or {}).items() if k != "signal_duid"}
    try:
        with set_extra_data(context_data={**inherited, "actor": actor, **fields}):
            yield
    finally:
        # auditlog's context does not put back the one it nests in when it ends: the
        # middleware's would then never disconnect its signal receiver, one more per request.
        if outer is not None:
            auditlog_value.set(outer)


class _UnsavedEntries(LogEntryManager):
    """log_create's entries, every field it fills filled the same way, but not saved."""

    def __init__(self) -> None:
        super().__init__()
        self.model = LogEntry

    def create(self, **fields: Any) -> LogEntry:
        entry = self.model(**fields)
        # What save() would send first: auditlog's context (the middleware's, or `acting`'s)
        # fills the actor, their email, the remote address and port, additional_data.
        using = router.db_for_write(self.model, instance=entry)
        pre_save.send(sender=self.model, instance=entry, raw=False, using=using, update_fields=None)
        return entry


_unsaved = _UnsavedEntries()


def _entry(old: Model | None, new: Model, *, action: int, fields: Iterable[str] | None = None):
    changes = model_instance_diff(
        old,
        new,
        fields_to_check=fields,
        use_json_for_changes=settings.AUDITLOG_STORE_JSON_CHANGES,
    )
    return _unsaved.log_create(new, action=action, changes=changes) if changes else None


def _log_all(entries: Iterable[LogEntry | None]) -> None:
    LogEntry.objects.bulk_create(
        [entry for entry in entries if entry is not None], batch_size=ENTRY_BATCH_SIZE
    )


def audited_update(queryset: QuerySet[M], **values: Any) -> int:
    """`queryset.update(**values)`, leaving each changed row's before and after in the log."""
    model = queryset.model._meta.concrete_model
    rows = model._base_manager.filter(pk__in=queryset.values("pk"))
    if auditlog_disabled.get():
        return rows.update(**values)
    with transaction.atomic():
        # Locked, so that what the entries say was before is what the update replaced.
        before = {row.pk: row for row in rows.select_for_update()}
        changed = model._base_manager.filter(pk__in=before).update(**values)
        _log_all(
            _entry(before[row.pk], row, action=LogEntry.Action.UPDATE, fields=values)
            for row in model._base_manager.filter(pk__in=before)
        )
    return changed


def audit_created(rows: Iterable[Model]) -> None:
    """Log the creation of rows that bulk_create inserted (with their primary keys)."""
    if auditlog_disabled.get():
        return
    _log_all(_entry(None, row, action=LogEntry.Action.CREATE) for row in rows)


def audit_changed(instance: Model, changes: dict[str, tuple[Any, Any]]) -> None:
    """Log a change of something kept outside the row's columns (a node's breaker, in Redis)
    as an update of the row: `changes` maps a name to its before and after."""
    if not auditlog_disabled.get():
        LogEntry.objects.log_create(instance, action=LogEntry.Action.UPDATE, changes=changes)
