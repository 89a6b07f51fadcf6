"""The management API's routing, for operators: the routing table (rules by alias and intent),
canaries, node breakers and the nightly weight recomputations."""

from __future__ import annotations

from decimal import Decimal

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.hardware.api.management import NodeMixin
from apps.models.models import MODEL_NAME_VALIDATOR, LlmModel, ModelVersion
from apps.models.services import MAX_CANARY_STEPS, CanaryGates
from apps.routing.choices import CanaryAction
from apps.routing.models import Canary, NodeBreaker, RoutingRule, WeightRecomputation
from apps.routing.selectors import canaries_running
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
from dmxplatform.api import NewestFirst, OperatorApiMixin
from dmxplatform.api.filters import ManagementFilterSet

# Far beyond any useful ratio between two routes, and finite: a JSON number such as 1e999
# reads as infinity, which no weighted choice survives.
MAX_WEIGHT = 1_000_000.0
MAX_PREFERRED_PROFILES = 50
# A latency bound beyond ten minutes bounds nothing a request would wait for.
MAX_LATENCY_MS = 600_000


class ModelNameField(serializers.SlugRelatedField):
    """A model by its name; text that cannot be a model's name is not looked up."""

    def to_internal_value(self, data):
        if not isinstance(data, str) or not MODEL_NAME_VALIDATOR.regex.fullmatch(data):
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().to_internal_value(data)


class RoutingRuleSerializer(serializers.ModelSerializer):
    model = ModelNameField(slug_field="name", queryset=LlmModel.objects.all())
    weight = serializers.FloatField(min_value=0.0, max_value=MAX_WEIGHT, required=False)
    hardware_preference = serializers.ListField(
        child=serializers.SlugField(max_length=64),
        max_length=MAX_PREFERRED_PROFILES,
        required=False,
        help_text='Hardware profile names to prefer, e.g. ["nvidia-h100-sxm"].',
    )

    class Meta:
        model = RoutingRule
        fields = [
            "id",
            "alias",
            "intent",
            "model",
            "weight",
            "hardware_preference",
            "tier",
            "is_active",
            "updated_at",
        ]
        read_only_fields = ["id", "updated_at"]
        # (alias, intent, model) is unique: routing_rule_save's full_clean says so, as a 400.
        validators = []


class RoutingRuleFilter(ManagementFilterSet):
    model = django_filters.CharFilter(field_name="model__name", label="A model.")

    class Meta:
        model = RoutingRule
        fields = ["alias", "intent", "model", "is_active"]


class ById(NewestFirst):
    ordering = "id"


class RoutingRuleMixin(OperatorApiMixin):
    serializer_class = RoutingRuleSerializer
    pagination_class = ById

    def get_queryset(self):
        return RoutingRule.objects.select_related("model")


@extend_schema_view(
    get=extend_schema(summary="List routing rules (operators)", tags=["routing-rules"]),
    post=extend_schema(
        summary="Create a routing rule (operators)",
        description="Gateways reload the routing table within a second.",
        tags=["routing-rules"],
        responses={201: RoutingRuleSerializer},
    ),
)
class RoutingRuleList(RoutingRuleMixin, generics.ListAPIView):
    filterset_class = RoutingRuleFilter

    def post(self, request: Request) -> Response:
        rule = routing_rule_save(rule=RoutingRule(**self.validated(RoutingRuleSerializer)))
        return Response(RoutingRuleSerializer(rule).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show a routing rule (operators)", tags=["routing-rules"]),
    patch=extend_schema(summary="Change a routing rule (operators)", tags=["routing-rules"]),
    delete=extend_schema(
        summary="Delete a routing rule (operators)", tags=["routing-rules"], responses={204: None}
    ),
)
class RoutingRuleDetail(RoutingRuleMixin, generics.RetrieveAPIView):
    def patch(self, request: Request, pk: int) -> Response:
        rule = routing_rule_save(rule=self.edited(self.get_object(), RoutingRuleSerializer))
        return Response(RoutingRuleSerializer(rule).data)

    def delete(self, request: Request, pk: int) -> Response:
        routing_rule_delete(rule=self.get_object())
        return Response(status=204)


# Canaries --------------------------------------------------------------------------------------


class CanaryGatesSerializer(serializers.Serializer):
    min_requests = serializers.IntegerField(
        min_value=1, help_text="Requests each step serves before it is judged."
    )
    error_tolerance = serializers.FloatField(
        min_value=0.0,
        max_value=1.0,
        help_text="How far the canary's error rate may exceed the stable versions', 0-1.",
    )
    latency_p95_ms = serializers.IntegerField(
        min_value=1,
        max_value=MAX_LATENCY_MS,
        allow_null=True,
        help_text="The P95 latency bound, ms; null: the model's latency SLA, and without one "
        "the stable versions' P95 plus a tenth.",
    )


class CanaryOutput(serializers.ModelSerializer):
    model = serializers.CharField(source="model.name")
    version = serializers.CharField(source="tag")
    percent = serializers.DecimalField(source="canary_percent", max_digits=5, decimal_places=2)
    steps = serializers.ListField(
        source="canary_steps", child=serializers.FloatField(), help_text="The ramp, %."
    )
    step = serializers.IntegerField(source="canary_step", help_text="The current step, from 0.")
    started_at = serializers.DateTimeField(source="canary_started_at")
    step_started_at = serializers.DateTimeField(source="canary_step_started_at", allow_null=True)
    gates = serializers.SerializerMethodField()

    class Meta:
        model = Canary
        fields = [
            "id",
            "model",
            "version",
            "percent",
            "steps",
            "step",
            "started_at",
            "step_started_at",
            "gates",
        ]
        read_only_fields = fields

    @extend_schema_field(CanaryGatesSerializer)
    def get_gates(self, version: Canary) -> dict:
        return CanaryGates.of(version).as_dict()


class CanaryStartInput(serializers.Serializer):
    version = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.filter(is_active=True).select_related("model"),
        help_text="The version's id; another stable version of its model takes the rest.",
    )
    percent = serializers.DecimalField(
        max_digits=5,
        decimal_places=2,
        min_value=Decimal("0.01"),
        max_value=Decimal(100),
        help_text="The share of the model's requests it takes first, %.",
    )
    steps = serializers.ListField(
        child=serializers.DecimalField(
            max_digits=5, decimal_places=2, min_value=Decimal("0.01"), max_value=Decimal(100)
        ),
        max_length=MAX_CANARY_STEPS - 1,
        required=False,
        help_text="The shares it takes next, each once the step before passes its gates, "
        "e.g. [25, 50, 100]; none: promoted once the first step passes.",
    )
    gates = CanaryGatesSerializer(
        required=False,
        help_text="Default: DMX_CANARY_MIN_REQUESTS, DMX_CANARY_ERROR_TOLERANCE and the "
        "model's latency SLA.",
    )


class CanaryMixin(OperatorApiMixin):
    serializer_class = CanaryOutput
    pagination_class = ById

    def get_queryset(self):
        return canaries_running()


@extend_schema_view(
    get=extend_schema(summary="List running canaries (operators)", tags=["canaries"]),
    post=extend_schema(
        summary="Start a canary (operators)",
        description="The version takes `percent` of its model's requests, then each step's "
        "share as the step before passes its gates; promoted after the last step, rolled back "
        "when a step fails a gate (evaluated every DMX_CANARY_EVALUATION_SECONDS).",
        tags=["canaries"],
        request=CanaryStartInput,
        responses={201: CanaryOutput},
    ),
)
class CanaryList(CanaryMixin, generics.ListAPIView):
    def post(self, request: Request) -> Response:
        fields = self.validated(CanaryStartInput)
        version = canary_start(
            version=fields["version"],
            percent=fields["percent"],
            steps=fields.get("steps", ()),
            gates=CanaryGates(**fields.get("gates", {})),
            operator=request.user,
        )
        return Response(CanaryOutput(self.get_queryset().get(pk=version.pk)).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show a running canary (operators)", tags=["canaries"])
)
class CanaryDetail(CanaryMixin, generics.RetrieveAPIView):
    pass


class CanaryEventOutput(serializers.Serializer):
    action = serializers.ChoiceField(choices=CanaryAction.choices)
    automatic = serializers.BooleanField()
    figures = serializers.DictField()
    created_at = serializers.DateTimeField()


class CanaryPromote(CanaryMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Promote a canary: make it the model's only stable version (operators)",
        tags=["canaries"],
        request=None,
        responses=CanaryEventOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        event = canary_promote(version=self.get_object(), operator=request.user)
        return Response(CanaryEventOutput(event).data)


class CanaryRollback(CanaryMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Roll back a canary: no more traffic (operators)",
        description="Its nodes stay up for an operator to inspect.",
        tags=["canaries"],
        request=None,
        responses=CanaryEventOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        event = canary_rollback(version=self.get_object(), operator=request.user)
        return Response(CanaryEventOutput(event).data)


# Breakers --------------------------------------------------------------------------------------


class BreakerReset(NodeMixin, generics.GenericAPIView):
    # Found among the nodes; a reset is the breakers' to allow, as in the admin (NodeBreakerAdmin).
    operated_model = NodeBreaker

    @extend_schema(
        summary="Reset (close) a node's circuit breaker (operators)",
        description="Gateways route to the node again at their next state refresh.",
        tags=["nodes"],
        request=None,
        responses={204: None},
    )
    def post(self, request: Request, pk: int) -> Response:
        breaker_reset(node_id=self.get_object().id)
        return Response(status=204)


# Weight recomputations -------------------------------------------------------------------------


class WeightRecomputationOutput(serializers.ModelSerializer):
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True)

    class Meta:
        model = WeightRecomputation
        fields = [
            "id",
            "created_at",
            "window_start",
            "window_end",
            "status",
            "changes",
            "decided_at",
            "decided_by",
        ]
        read_only_fields = fields


class WeightRecomputationFilter(ManagementFilterSet):
    class Meta:
        model = WeightRecomputation
        fields = ["status"]


class WeightRecomputationMixin(OperatorApiMixin):
    serializer_class = WeightRecomputationOutput

    def get_queryset(self):
        return WeightRecomputation.objects.select_related("decided_by")


@extend_schema_view(
    get=extend_schema(
        summary="List nightly routing-weight recomputations (operators)",
        tags=["weight-recomputations"],
    )
)
class WeightRecomputationList(WeightRecomputationMixin, generics.ListAPIView):
    filterset_class = WeightRecomputationFilter


@extend_schema_view(
    get=extend_schema(
        summary="Show a routing-weight recomputation (operators)", tags=["weight-recomputations"]
    )
)
class WeightRecomputationDetail(WeightRecomputationMixin, generics.RetrieveAPIView):
    pass


class WeightRecomputationApply(WeightRecomputationMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Apply a proposed recomputation's weights (operators)",
        description="Gateways reload the routing table within a second.",
        tags=["weight-recomputations"],
        request=None,
        responses=WeightRecomputationOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        recomputation = weights_apply(recomputation=self.get_object(), operator=request.user)
        return Response(WeightRecomputationOutput(recomputation).data)


class WeightRecomputationReject(WeightRecomputationMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Reject a proposed recomputation (operators)",
        tags=["weight-recomputations"],
        request=None,
        responses=WeightRecomputationOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        recomputation = weights_reject(recomputation=self.get_object(), operator=request.user)
        return Response(WeightRecomputationOutput(recomputation).data)
