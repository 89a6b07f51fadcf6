"""Reads for the gateway: the content filter's terms, stored responses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Sum
from django.utils import timezone

from apps.gateway.content_filter import ContentFilter, FilterAction, Term
from apps.gateway.models import SensitiveTerm, StoredResponse
from apps.gateway.response_records import ResponseRecord


@dataclass(frozen=True)
class StoredResponsesUsage:
    count: int
    size_bytes: int
    next_expiry: datetime | None


def content_filter_load(*, version: int = 0) -> ContentFilter:
    """Build the content filter from the active terms; sync ORM, so call it off the event loop."""
    rows = SensitiveTerm.objects.filter(is_active=True).values_list("term", "category", "action")
    return ContentFilter(
        (Term(text, category, FilterAction(action)) for text, category, action in rows.iterator()),
        version=version,
    )


def _stored_responses(tenant_id: int):
    """The tenant's stored responses: neither expired nor deleted."""
    return StoredResponse.objects.filter(
        tenant_id=tenant_id, expires_at__gt=timezone.now(), deleted_at__isnull=True
    )


def stored_response_get(*, response_id: str, tenant_id: int) -> tuple[ResponseRecord, int] | None:
    """The tenant's stored response of that id, and its size, if it has one."""
    row = (
        _stored_responses(tenant_id)
        .filter(id=response_id)
        .values_list("api_key_id", "created_at", "response", "input_items", "size_bytes")
        .first()
    )
    if row is None:
        return None
    api_key_id, created_at, response, items, size = row
    return ResponseRecord(tenant_id, api_key_id or 0, created_at.timestamp(), response, items), size


def stored_responses_usage(*, tenant_id: int) -> StoredResponsesUsage:
    """What a tenant's stored responses take: how many, how many bytes, the oldest's expiry."""
    totals = _stored_responses(tenant_id).aggregate(
        count=Count("id"), size=Sum("size_bytes"), next_expiry=Min("expires_at")
    )
    return StoredResponsesUsage(
        count=totals["count"], size_bytes=totals["size"] or 0, next_expiry=totals["next_expiry"]
    )
