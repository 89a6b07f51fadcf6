"""The management API's routing table, for operators: rules by alias and intent."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.keys.api.auth import NewestFirst, OperatorApiMixin
from apps.keys.api.filters import ManagementFilterSet
from apps.models.models import MODEL_NAME_VALIDATOR, LlmModel
from apps.routing.models import RoutingRule
from apps.routing.services import routing_rule_delete, routing_rule_save

# Far beyond any useful ratio between two routes, and finite: a JSON number such as 1e999
# reads as infinity, which no weighted choice survives.
MAX_WEIGHT = 1_000_000.0
MAX_PREFERRED_PROFILES = 50


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
