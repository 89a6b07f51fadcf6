"""The management API's models: what a tenant's keys may be given, and what is served now."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.hardware.selectors import models_available
from apps.models.choices import ModelKind
from dmxplatform.api import ManagementApiMixin


class ModelOutput(serializers.Serializer):
    name = serializers.CharField(help_text="What requests name in `model`.")
    description = serializers.CharField()
    owned_by = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=ModelKind.choices, help_text="`generate` (chat, completions) or `embed`."
    )
    context_length = serializers.IntegerField(help_text="Prompt plus completion tokens.")
    served = serializers.BooleanField(help_text="A node takes this model's requests now.")


class ModelList(ManagementApiMixin, APIView):
    pagination_class = None  # the catalog: tens of models

    @extend_schema(
        summary="List the models your keys may use, with whether each is served now",
        tags=["models"],
        responses=ModelOutput(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(ModelOutput(models_available(), many=True).data)
