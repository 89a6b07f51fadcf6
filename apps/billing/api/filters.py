"""Query filters of billing's management API lists (dmxplatform.api.filters' rules)."""

from __future__ import annotations

import django_filters

from apps.billing.choices import MovementKind
from apps.billing.models import BalanceMovement
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
