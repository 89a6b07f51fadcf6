"""Admin for scaling policies and their events (imported by apps.routing.admin)."""

from __future__ import annotations

import copy

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.models import construct_instance
from django.http import HttpRequest

from apps.routing.choices import ScalingAction, ScalingTrigger
from apps.routing.models import ScalingEvent, ScalingPolicy
from apps.routing.scaling.scalers import policy_problems
from apps.routing.scaling.services import scaling_evaluate
from dmxplatform.admin import OperatorActions, ReadOnlyAdminMixin
from dmxplatform.errors import ApplicationError


class ScalingPolicyForm(forms.ModelForm):
    class Meta:
        model = ScalingPolicy
        fields = "__all__"

    def clean(self) -> dict:
        cleaned = super().clean()
        if cleaned.get("model") is not None:
            # The policy as it would be saved, checked for what its backend needs.
            policy = construct_instance(self, copy.copy(self.instance))
            for field, message in policy_problems(policy).items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned


@admin.register(ScalingPolicy)
class ScalingPolicyAdmin(OperatorActions, admin.ModelAdmin):
    form = ScalingPolicyForm
    list_display = [
        "model",
        "backend",
        "min_replicas",
        "max_replicas",
        "target_queue_per_node",
        "consecutive_breaches",
        "consecutive_calm",
        "last_scaled_at",
        "is_active",
    ]
    list_filter = ["backend", "is_active"]
    list_select_related = ["model"]
    search_fields = ["model__name"]
    readonly_fields = ["consecutive_breaches", "consecutive_calm", "last_scaled_at"]
    actions = ["evaluate_now"]

    @admin.action(
        description="Evaluate now (and scale if the SLO says so)", permissions=["operate"]
    )
    def evaluate_now(self, request: HttpRequest, queryset: QuerySet[ScalingPolicy]) -> None:
        for policy in queryset.select_related("model"):
            try:
                event = scaling_evaluate(policy_id=policy.pk, trigger=ScalingTrigger.OPERATOR)
            except ApplicationError as exc:
                self.message_user(request, f"{policy.model}: {exc.message}", messages.ERROR)
                continue
            self.message_user(
                request,
                f"{policy.model}: {event.get_action_display().lower()} "
                f"{event.from_replicas} -> {event.to_replicas}: {event.reason}",
                messages.SUCCESS if event.action != ScalingAction.HOLD else messages.INFO,
            )


@admin.register(ScalingEvent)
class ScalingEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Written by evaluations only."""

    list_display = [
        "created_at",
        "policy",
        "trigger",
        "action",
        "from_replicas",
        "to_replicas",
        "reason",
    ]
    list_filter = ["action", "trigger", "policy__model"]
    list_select_related = ["policy__model"]
    date_hierarchy = "created_at"
