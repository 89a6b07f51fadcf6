"""Query filters of the keys' management API lists (dmxplatform.api.filters' rules)."""

from __future__ import annotations

import django_filters

from apps.keys.choices import UsageStatus
from apps.keys.models import ApiKey, Tenant, UsageDaily, UsageRecord
from dmxplatform.api.filters import BooleanFilter, ManagementFilterSet, MomentFilter


class ApiKeyFilter(ManagementFilterSet):
    revoked = BooleanFilter(
        field_name="revoked_at", lookup_expr="isnull", exclude=True, label="Revoked or not."
    )

    class Meta:
        model = ApiKey
        fields = ["revoked"]


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


class TenantFilter(ManagementFilterSet):
    approved = BooleanFilter(
        field_name="approved_at", lookup_expr="isnull", exclude=True, label="Approved or waiting."
    )

    class Meta:
        model = Tenant
        fields = ["approved", "is_active", "plan"]
