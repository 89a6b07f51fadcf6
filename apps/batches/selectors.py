"""Reads for files and batches: one tenant's, paged as OpenAI pages them (newest first,
`after` an id, `limit` up to 100)."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.batches.models import Batch, File
from dmxplatform.errors import InvalidRequestError, NotFoundError


def file_get(file_id: str, tenant_id: int) -> File:
    file = File.objects.filter(id=file_id, tenant_id=tenant_id).first()
    if file is None:
        raise NotFoundError(f"No such File object: {file_id}", param="id")
    return file


def batch_get(batch_id: str, tenant_id: int) -> Batch:
    batch = Batch.objects.filter(id=batch_id, tenant_id=tenant_id).first()
    if batch is None:
        raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
    return batch


def files_page(
    tenant_id: int, *, purpose: str | None, limit: int, after: str | None, ascending: bool
) -> tuple[list[File], bool]:
    files = File.objects.filter(tenant_id=tenant_id)
    if purpose:
        files = files.filter(purpose=purpose)
    return _page(files, limit, after, ascending)


def batches_page(tenant_id: int, *, limit: int, after: str | None) -> tuple[list[Batch], bool]:
    return _page(Batch.objects.filter(tenant_id=tenant_id), limit, after, ascending=False)


def _page(rows: QuerySet, limit: int, after: str | None, ascending: bool):
    order = ("created_at", "id") if ascending else ("-created_at", "-id")
    rows = rows.order_by(*order)
    if after:
        cursor = rows.filter(id=after).values("created_at", "id").first()
        if cursor is None:
            raise InvalidRequestError(f"No object with id `{after}` to list after.", param="after")
        moment, ident = cursor["created_at"], cursor["id"]
        if ascending:
            rows = rows.filter(created_at__gte=moment).exclude(created_at=moment, id__lte=ident)
        else:
            rows = rows.filter(created_at__lte=moment).exclude(created_at=moment, id__gte=ident)
    found = list(rows[: limit + 1])
    return found[:limit], len(found) > limit


def batches_of_tenant(tenant_id: int) -> QuerySet[Batch]:
    """The portal's list: every batch of the tenant, newest first."""
    return Batch.objects.filter(tenant_id=tenant_id).order_by("-created_at")
