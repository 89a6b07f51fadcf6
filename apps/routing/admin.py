import json
from datetime import UTC, datetime

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils import timezone

from apps.hardware.fleet import now
from apps.routing.breaker import Breaker, BreakerState, breakers_key
from apps.routing.choices import RecomputationStatus
from apps.routing.models import (
    Canary,
    CanaryEvent,
    NodeBreaker,
    RoutingDecision,
    RoutingRule,
    WeightRecomputation,
)
from apps.routing.scaling import admin as scaling_admin  # noqa: F401  (registers its models)
from apps.routing.selectors import version_figures
from apps.routing.services import (
    breaker_reset,
    canary_promote,
    canary_rollback,
    routing_rule_save,
    routing_table_invalidate,
    weights_apply,
    weights_reject,
)
from dmxplatform.admin import OperatorActions
from dmxplatform.redis_client import sync_redis


@admin.register(RoutingRule)
class RoutingRuleAdmin(admin.ModelAdmin):
    list_display = ["alias", "intent", "model", "weight", "hardware_preference", "is_active"]
    list_filter = ["alias", "intent", "is_active"]
    list_editable = ["weight", "is_active"]

    def save_model(self, request: HttpRequest, obj: RoutingRule, form, change: bool) -> None:
        routing_rule_save(rule=obj)

    def delete_model(self, request: HttpRequest, obj: RoutingRule) -> None:
        super().delete_model(request, obj)
        routing_table_invalidate()


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(RoutingDecision)
class RoutingDecisionAdmin(ReadOnly):
    list_display = [
        "request_id",
        "created_at",
        "requested_model",
        "model",
        "intent",
        "priority",
        "outcome",
        "chosen_node",
        "waited_ms",
        "decision_us",
    ]
    list_filter = ["outcome", "model", "intent"]
    search_fields = ["request_id"]
    date_hierarchy = "created_at"
    readonly_fields = ["candidates_table"]

    @admin.display(description="Candidates")
    def candidates_table(self, decision: RoutingDecision) -> str:
        return render_to_string(
            "admin/routing/decision_candidates.html",
            {
                "pool": decision.candidates.get("pool"),
                "fallback": decision.candidates.get("fallback"),
                "nodes": decision.candidates.get("nodes", []),
            },
        )


@admin.register(WeightRecomputation)
class WeightRecomputationAdmin(OperatorActions, ReadOnly):
    list_display = ["created_at", "window_start", "window_end", "status", "decided_by"]
    list_filter = ["status"]
    readonly_fields = ["changes_table"]
    actions = ["approve", "reject"]

    @admin.display(description="Changes")
    def changes_table(self, recomputation: WeightRecomputation) -> str:
        return render_to_string(
            "admin/routing/weight_changes.html", {"changes": recomputation.changes}
        )

    @admin.action(description="Apply the selected recomputations", permissions=["operate"])
    def approve(self, request: HttpRequest, queryset: QuerySet[WeightRecomputation]) -> None:
        for recomputation in queryset.filter(status=RecomputationStatus.PROPOSED):
            weights_apply(recomputation=recomputation, operator=request.user)
        messages.success(request, "Weights applied.")

    @admin.action(description="Reject the selected recomputations", permissions=["operate"])
    def reject(self, request: HttpRequest, queryset: QuerySet[WeightRecomputation]) -> None:
        for recomputation in queryset.filter(status=RecomputationStatus.PROPOSED):
            weights_reject(recomputation=recomputation, operator=request.user)


@admin.register(CanaryEvent)
class CanaryEventAdmin(ReadOnly):
    list_display = ["created_at", "version", "action", "automatic", "operator", "figures"]
    list_filter = ["action", "automatic"]


@admin.register(Canary)
class CanaryAdmin(OperatorActions, admin.ModelAdmin):
    """Versions taking canary traffic, their figures so far, and the operator's two buttons."""

    list_display = ["__str__", "canary_percent", "canary_started_at", "figures"]
    actions = ["promote", "rollback"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(is_stable=False, canary_percent__gt=0)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="Figures since it started")
    def figures(self, version: Canary) -> str:
        since = version.canary_started_at or timezone.now()
        return json.dumps(version_figures(version=version, since=since).as_dict())

    @admin.action(description="Promote: make stable", permissions=["operate"])
    def promote(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        for version in queryset:
            figures = version_figures(version=version, since=version.canary_started_at).as_dict()
            canary_promote(version=version, figures=figures, automatic=False, operator=request.user)
        messages.success(request, "Promoted.")

    @admin.action(description="Roll back: no more traffic", permissions=["operate"])
    def rollback(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        for version in queryset:
            figures = version_figures(version=version, since=version.canary_started_at).as_dict()
            canary_rollback(
                version=version, figures=figures, automatic=False, operator=request.user
            )
        messages.success(request, "Rolled back.")


@admin.register(NodeBreaker)
class NodeBreakerAdmin(OperatorActions, admin.ModelAdmin):
    """Every node's circuit breaker as gateways see it in Redis; operators can close one."""

    list_display = ["name", "status", "breaker_state", "breaker_failures", "breaker_opened"]
    actions = ["reset"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        self._breakers = {
            int(node): Breaker.parse(raw)
            for node, raw in sync_redis().hgetall(breakers_key()).items()
        }
        return super().get_queryset(request)

    def _breaker(self, node: NodeBreaker) -> Breaker | None:
        return getattr(self, "_breakers", {}).get(node.id)

    @admin.display(description="Breaker")
    def breaker_state(self, node: NodeBreaker) -> str:
        breaker = self._breaker(node)
        if breaker is None:
            return BreakerState.CLOSED
        return breaker.current(now(), settings.DMX_BREAKER_COOLDOWN_SECONDS)

    @admin.display(description="Failures")
    def breaker_failures(self, node: NodeBreaker) -> int:
        breaker = self._breaker(node)
        return breaker.failures if breaker else 0

    @admin.display(description="Opened at")
    def breaker_opened(self, node: NodeBreaker) -> str:
        breaker = self._breaker(node)
        if breaker is None or not breaker.opened_at:
            return ""
        return datetime.fromtimestamp(breaker.opened_at, tz=UTC).isoformat(timespec="seconds")

    @admin.action(description="Reset (close) the selected breakers", permissions=["operate"])
    def reset(self, request: HttpRequest, queryset: QuerySet[NodeBreaker]) -> None:
        for node in queryset:
            breaker_reset(node_id=node.id)
        messages.success(request, "Breakers reset.")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
