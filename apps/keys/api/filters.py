"""Query filters of the keys' management API lists (dmxplatform.api.filters' rules)."""

from __future__ import annotations

from apps.keys.models import ApiKey, Tenant
from dmxplatform.api.filters import BooleanFilter, ManagementFilterSet


class ApiKeyFilter(ManagementFilterSet):
    revoked = BooleanFilter(
        field_name="revoked_at", lookup_expr="isnull", exclude=True, label="Revoked or not."
    )

    class Meta:
        model = ApiKey
        fields = ["revoked"]


class TenantFilter(ManagementFilterSet):
    approved = BooleanFilter(
        field_name="approved_at", lookup_expr="isnull", exclude=True, label="Approved or waiting."
    )

    class Meta:
        model = Tenant
        fields = ["approved", "is_active", "plan"]
