"""Query filters of billing's management API lists (dmxplatform.api.filters' rules)."""

from __future__ import annotations

import django_filters

from apps.billing.choices import MovementKind, UsageStatus
from apps.billing.models import BalanceMovement, UsageDaily, UsageRecord
from dmxplatform.api.filters import ManagementFilterSet, MomentFilter


class MovementFilter(ManagementFilterSet):
    since = MomentFilter(
        field_name="created_at", lookup_expr="gte", label="From this moment (ISO 8601)."
    )
    until = MomentFilter(
        field_name="created_at", lookup_expr="lt", label="Before this moment (ISO 8601)."
    )
    kind = django_filters.ChoiceFilter(choices=MovementKind.choices, label="What moved it.")

    class Meta:
        model = BalanceMovement
        fields = ["since", "until", "kind"]


class UsageRecordFilter(ManagementFilterSet):
    since = MomentFilter(
        field_name="created_at", lookup_expr="gte", label="From this moment (ISO 8601)."
    )
    until = MomentFilter(
        field_name="created_at", lookup_expr="lt", label="Before this moment (ISO 8601)."
    )
    key = django_filters.CharFilter(field_name="api_key__key_id", label="A key's id (key_id).")
    model = django_filters.CharFilter(label="A model name.")
    status = django_filters.ChoiceFilter(choices=UsageStatus.choices, label="How it ended.")

    class Meta:
        model = UsageRecord
        fields = ["since", "until", "key", "model", "status"]


class UsageDailyFilter(ManagementFilterSet):
    since = django_filters.DateFilter(
        field_name="day", lookup_expr="gte", label="From this UTC day (YYYY-MM-DD)."
    )
    until = django_filters.DateFilter(
        field_name="day", lookup_expr="lt", label="Before this UTC day (YYYY-MM-DD)."
    )
    key = django_filters.CharFilter(field_name="api_key__key_id", label="A key's id (key_id).")
    model = django_filters.CharFilter(label="A model name.")

    class Meta:
        model = UsageDaily
        fields = ["since", "until", "key", "model"]
