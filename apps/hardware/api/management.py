"""The management API's nodes, for operators: the fleet as the last sync saw it, and drains."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.hardware.selectors import node_list
from apps.hardware.services import node_drain, node_undrain
from dmxplatform.api import ByName, OperatorApiMixin
from dmxplatform.api.filters import ManagementFilterSet


class NodeOutput(serializers.ModelSerializer):
    model = serializers.CharField(source="model_version.model.name")
    version = serializers.CharField(source="model_version.tag")
    profile = serializers.CharField(source="profile.name", allow_null=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "url",
            "status",
            "drained",
            "model",
            "version",
            "served_model_name",
            "max_model_len",
            "profile",
            "registered_at",
            "last_heartbeat_at",
            "num_requests_running",
            "num_requests_waiting",
            "kv_cache_usage",
        ]
        read_only_fields = fields


class NodeFilter(ManagementFilterSet):
    status = django_filters.ChoiceFilter(choices=NodeStatus.choices, label="As last reported.")
    model = django_filters.CharFilter(field_name="model_version__model__name", label="A model.")

    class Meta:
        model = Node
        fields = ["status", "drained", "model"]


class NodeMixin(OperatorApiMixin):
    serializer_class = NodeOutput
    pagination_class = ByName

    def get_queryset(self):
        return node_list()


@extend_schema_view(get=extend_schema(summary="List nodes (operators)", tags=["nodes"]))
class NodeList(NodeMixin, generics.ListAPIView):
    filterset_class = NodeFilter


@extend_schema_view(get=extend_schema(summary="Show a node (operators)", tags=["nodes"]))
class NodeDetail(NodeMixin, generics.RetrieveAPIView):
    pass


class NodeDrain(NodeMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Drain a node (operators)",
        description="Gateways send it no new requests while its in-flight ones finish; it stays "
        "drained across heartbeats and re-registration until undrained.",
        tags=["nodes"],
        request=None,
        responses=NodeOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        return Response(NodeOutput(node_drain(node=self.get_object())).data)


class NodeUndrain(NodeMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Undrain a node (operators)",
        description="Gateways route new requests to it again.",
        tags=["nodes"],
        request=None,
        responses=NodeOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        return Response(NodeOutput(node_undrain(node=self.get_object())).data)
