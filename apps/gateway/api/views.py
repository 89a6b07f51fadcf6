"""The management API's view of the gateway's data: what a tenant's stored responses take."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.gateway.selectors import stored_responses_usage
from dmxplatform.api import TenantScopedApiMixin


class StoredResponsesUsageOutput(serializers.Serializer):
    count = serializers.IntegerField(help_text="Stored responses of /v1/responses not expired.")
    size_bytes = serializers.IntegerField(help_text="What they take, as stored JSON.")
    next_expiry = serializers.DateTimeField(allow_null=True, help_text="When the oldest expires.")
    retention_days = serializers.IntegerField(help_text="How long each is kept.")


class StoredResponsesUsage(TenantScopedApiMixin, APIView):
    @extend_schema(
        summary="Show what the tenant's stored responses take",
        description="Responses of /v1/responses are stored unless a request sends "
        "`store: false`; each is kept `retention_days`, and `DELETE /v1/responses/{id}` removes "
        "one sooner.",
        tags=["usage"],
        responses=StoredResponsesUsageOutput,
    )
    def get(self, request: Request) -> Response:
        usage = stored_responses_usage(tenant_id=self.tenant_id)
        body = {
            "count": usage.count,
            "size_bytes": usage.size_bytes,
            "next_expiry": usage.next_expiry,
            "retention_days": settings.DMX_RESPONSES_RETENTION_DAYS,
        }
        return Response(StoredResponsesUsageOutput(body).data)
