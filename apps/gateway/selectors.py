"""Reads for the gateway: the content filter's terms."""

from __future__ import annotations

from apps.gateway.content_filter import ContentFilter, FilterAction, Term
from apps.gateway.models import SensitiveTerm


def content_filter_load(*, version: int = 0) -> ContentFilter:
    """Build the content filter from the active terms; sync ORM, so call it off the event loop."""
    rows = SensitiveTerm.objects.filter(is_active=True).values_list("term", "category", "action")
    return ContentFilter(
        (Term(text, category, FilterAction(action)) for text, category, action in rows.iterator()),
        version=version,
    )
