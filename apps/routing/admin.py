import json
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from apps.hardware.fleet import now
from apps.models.models import ModelVersion
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
from apps.routing.selectors import canaries_running, version_figures
from apps.routing.services import (
    CanaryGates,
    breaker_reset,
    canary_promote,
    canary_rollback,
    canary_start,
    routing_rule_save,
    routing_table_invalidate,
    weights_apply,
    weights_reject,
)
from dmxplatform.admin import OperatorActions, request_trace_link
from dmxplatform.redis_client import sync_redis


def _each(request: HttpRequest, queryset: QuerySet, action, *, name: str = "recomputation") -> int:
    """Run a service on each selected row as the operator; a row someone else changed first
    (the service refuses it) is reported, not a 500. Returns how many went through."""
    done = 0
    for row in queryset:
        try:
            action(**{name: row}, operator=request.user)
        except ValidationError as error:
            messages.error(request, f"{row}: {' '.join(error.messages)}")
        else:
            done += 1
    return done


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
    readonly_fields = ["trace", "candidates_table"]

    @admin.display(description="Trace")
    def trace(self, decision: RoutingDecision) -> str:
        return request_trace_link(decision.request_id)

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
        proposed = queryset.filter(status=RecomputationStatus.PROPOSED)
        applied = _each(request, proposed, weights_apply)
        messages.success(request, f"Weights applied: {applied}.")

    @admin.action(description="Reject the selected recomputations", permissions=["operate"])
    def reject(self, request: HttpRequest, queryset: QuerySet[WeightRecomputation]) -> None:
        proposed = queryset.filter(status=RecomputationStatus.PROPOSED)
        rejected = _each(request, proposed, weights_reject)
        messages.success(request, f"Recomputations rejected: {rejected}.")


@admin.register(CanaryEvent)
class CanaryEventAdmin(ReadOnly):
    list_display = ["created_at", "version", "action", "automatic", "operator", "figures"]
    list_filter = ["action", "automatic"]


class CanaryStartForm(forms.Form):
    """What canary_start takes; empty gates are its defaults (CanaryGates.filled: settings
    and the model's SLA)."""

    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.filter(is_active=True, canary_percent=0).select_related(
            "model"
        ),
        help_text="It leaves the stable versions; another stable version takes the rest.",
    )
    percent = forms.DecimalField(
        min_value=Decimal("0.01"),
        max_value=100,
        decimal_places=2,
        initial=5,
        help_text="Share of the model's requests it takes first, %.",
    )
    steps = forms.CharField(
        required=False,
        initial="25, 50, 100",
        help_text="The shares it takes next, one step each time a step passes its gates, "
        "e.g. 25, 50, 100; empty: promoted once the first step passes.",
    )
    min_requests = forms.IntegerField(
        required=False, min_value=1, help_text="Gate: requests each step serves before judged."
    )
    error_tolerance = forms.FloatField(
        required=False,
        min_value=0,
        max_value=1,
        help_text="Gate: how far its error rate may exceed the stable versions' (0.01 = 1 point).",
    )
    latency_p95_ms = forms.IntegerField(
        required=False, min_value=1, help_text="Gate: the P95 latency bound, ms."
    )

    def clean_steps(self) -> list[Decimal]:
        try:
            return [Decimal(part) for part in self.cleaned_data["steps"].replace(",", " ").split()]
        except InvalidOperation:
            raise forms.ValidationError(
                "Percentages separated by commas, e.g. 25, 50, 100."
            ) from None

    def gates(self) -> CanaryGates:
        """The gates the operator typed; canary_start fills in those left empty."""
        data = self.cleaned_data
        return CanaryGates(
            min_requests=data["min_requests"],
            error_tolerance=data["error_tolerance"],
            latency_p95_ms=data["latency_p95_ms"],
        )


@admin.register(Canary)
class CanaryAdmin(OperatorActions, admin.ModelAdmin):
    """Versions taking canary traffic: their ramp, gates and figures so far, a form to start
    one, and the operator's two buttons."""

    list_display = ["__str__", "canary_percent", "ramp", "gates", "canary_started_at", "figures"]
    actions = ["promote", "rollback"]
    change_list_template = "admin/routing/canary/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return canaries_running()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a canary is started from a version: start_view

    def get_urls(self):
        start = path(
            "start/", self.admin_site.admin_view(self.start_view), name="routing_canary_start"
        )
        return [start, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context=None):
        extra_context = {**(extra_context or {}), "can_start": self.has_operate_permission(request)}
        return super().changelist_view(request, extra_context)

    def start_view(self, request: HttpRequest) -> HttpResponse:
        """The intermediate page that starts a canary: version, first share, steps, gates."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        form = CanaryStartForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                version = canary_start(
                    version=form.cleaned_data["version"],
                    percent=form.cleaned_data["percent"],
                    steps=form.cleaned_data["steps"],
                    gates=form.gates(),
                    operator=request.user,
                )
            except ValidationError as error:
                for field, messages_ in error.message_dict.items():
                    form.add_error(field if field in form.fields else None, messages_)
            else:
                messages.success(request, f"Canary {version} started at {version.canary_percent}%.")
                return HttpResponseRedirect(reverse("admin:routing_canary_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Start a canary",
            "form": form,
        }
        return TemplateResponse(request, "admin/routing/canary/start.html", context)

    @admin.display(description="Step")
    def ramp(self, version: Canary) -> str:
        steps = version.canary_steps or [float(version.canary_percent)]
        shown = " → ".join(
            f"[{p:g}%]" if i == version.canary_step else f"{p:g}%" for i, p in enumerate(steps)
        )
        return f"{version.canary_step + 1} of {len(steps)}: {shown}"

    @admin.display(description="Gates")
    def gates(self, version: Canary) -> str:
        gates = CanaryGates.of(version)
        latency = f"≤ {gates.latency_p95_ms} ms" if gates.latency_p95_ms else "stable's + 10%"
        return (
            f"{gates.min_requests} requests, errors ≤ stable's + {gates.error_tolerance:g}, "
            f"P95 {latency}"
        )

    @admin.display(description="Figures of this step")
    def figures(self, version: Canary) -> str:
        since = version.canary_step_started_at or version.canary_started_at or timezone.now()
        return json.dumps(version_figures(version=version, since=since).as_dict())

    @admin.action(description="Promote: make stable", permissions=["operate"])
    def promote(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        promoted = _each(request, queryset, canary_promote, name="version")
        messages.success(request, f"Promoted: {promoted}.")

    @admin.action(description="Roll back: no more traffic", permissions=["operate"])
    def rollback(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        rolled_back = _each(request, queryset, canary_rollback, name="version")
        messages.success(request, f"Rolled back: {rolled_back}.")


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
