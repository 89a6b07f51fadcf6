import functools
import json
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse

from apps.models.admin import ModelVersionWrites
from apps.models.models import ModelVersion
from apps.models.services import CanaryGates
from apps.routing.choices import RecomputationStatus
from apps.routing.models import (
    Canary,
    CanaryEvent,
    NodeBreaker,
    RoutingDecision,
    RoutingRule,
    WeightRecomputation,
    WorkProfile,
)
from apps.routing.scaling import admin as scaling_admin  # noqa: F401  (registers its models)
from apps.routing.selectors import (
    CLOSED_BREAKER,
    BreakerView,
    canaries_running,
    canary_step_figures,
    node_breakers,
)
from apps.routing.services import (
    breaker_reset,
    canary_promote,
    canary_rollback,
    canary_start,
    routing_rule_delete,
    routing_rule_save,
    weights_apply,
    weights_reject,
)
from dmxplatform.admin import (
    OperatorActions,
    ReadOnlyAdminMixin,
    ServiceDeletesMixin,
    request_trace_link,
)


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
class RoutingRuleAdmin(ServiceDeletesMixin, admin.ModelAdmin):
    list_display = [
        "alias",
        "intent",
        "model",
        "weight",
        "tier",
        "hardware_preference",
        "is_active",
    ]
    list_filter = ["alias", "intent", "tier", "is_active"]
    list_editable = ["weight", "is_active"]

    def save_model(self, request: HttpRequest, obj: RoutingRule, form, change: bool) -> None:
        routing_rule_save(rule=obj)

    def delete_row(self, obj: RoutingRule) -> None:
        routing_rule_delete(rule=obj)


class RoutingLogAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """What the platform wrote down (decisions, recomputations, canary events): read here, and
    deleted by those allowed to, never added or edited."""

    console_refuses = ("add", "change")


@admin.register(RoutingDecision)
class RoutingDecisionAdmin(RoutingLogAdmin):
    list_display = [
        "request_id",
        "created_at",
        "requested_model",
        "model",
        "intent",
        "intent_confidence",
        "priority",
        "outcome",
        "chosen_node",
        "waited_ms",
        "decision_us",
    ]
    list_filter = ["outcome", "model", "intent", "intent_low_confidence"]
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
class WeightRecomputationAdmin(OperatorActions, RoutingLogAdmin):
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


@admin.register(WorkProfile)
class WorkProfileAdmin(RoutingLogAdmin):
    """What the router predicts a request's decode work from (recomputed from the ledger)."""

    list_display = [
        "model",
        "intent",
        "api_key",
        "requests",
        "completion_p50",
        "completion_p95",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "latency_p50_ms",
        "latency_p95_ms",
        "computed_at",
    ]
    list_filter = ["model", "intent"]


@admin.register(CanaryEvent)
class CanaryEventAdmin(RoutingLogAdmin):
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
class CanaryAdmin(OperatorActions, ModelVersionWrites, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Versions taking canary traffic: their ramp, gates and figures so far, a form to start
    one, and the operator's two buttons."""

    list_display = ["__str__", "canary_percent", "ramp", "gates", "canary_started_at", "figures"]
    actions = ["promote", "rollback"]
    change_list_template = "admin/routing/canary/change_list.html"
    console_refuses = ("add",)  # a canary is started from a version: start_view

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return canaries_running()

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
        return json.dumps(canary_step_figures(version=version).as_dict())

    @admin.action(description="Promote: make stable", permissions=["operate"])
    def promote(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        promoted = _each(request, queryset, canary_promote, name="version")
        messages.success(request, f"Promoted: {promoted}.")

    @admin.action(description="Roll back: no more traffic", permissions=["operate"])
    def rollback(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        rolled_back = _each(request, queryset, canary_rollback, name="version")
        messages.success(request, f"Rolled back: {rolled_back}.")


def _breaker_columns() -> list[Callable[[NodeBreaker], object]]:
    """The breaker columns of one request's list. The ModelAdmin is one instance that every
    request shares, so what they read from Redis (once, at the first row shown) stays with
    these columns, which get_list_display makes for each request."""
    breakers = functools.cache(node_breakers)

    def breaker(node: NodeBreaker) -> BreakerView:
        return breakers().get(node.id, CLOSED_BREAKER)

    @admin.display(description="Breaker")
    def breaker_state(node: NodeBreaker) -> str:
        return breaker(node).state

    @admin.display(description="Failures")
    def breaker_failures(node: NodeBreaker) -> int:
        return breaker(node).failures

    @admin.display(description="Opened at")
    def breaker_opened(node: NodeBreaker) -> str:
        opened_at = breaker(node).opened_at
        return opened_at.isoformat(timespec="seconds") if opened_at else ""

    return [breaker_state, breaker_failures, breaker_opened]


@admin.register(NodeBreaker)
class NodeBreakerAdmin(OperatorActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every node's circuit breaker as gateways see it in Redis; operators can close one."""

    list_display = ["name", "status"]  # and the breaker's columns: get_list_display
    actions = ["reset"]
    console_refuses = ("add", "change")

    def get_list_display(self, request: HttpRequest) -> list[str | Callable[[NodeBreaker], object]]:
        return [*super().get_list_display(request), *_breaker_columns()]

    @admin.action(description="Reset (close) the selected breakers", permissions=["operate"])
    def reset(self, request: HttpRequest, queryset: QuerySet[NodeBreaker]) -> None:
        for node in queryset:
            breaker_reset(node_id=node.id)
        messages.success(request, "Breakers reset.")
