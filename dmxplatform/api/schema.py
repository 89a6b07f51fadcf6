"""The management API's OpenAPI description: its security scheme, its one error shape, and the
errors every operation declares (derived from the view's permissions, method and inputs, so
that a new endpoint cannot forget them)."""

from __future__ import annotations

import inspect

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import permissions, serializers


class ErrorDetailSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    code = serializers.CharField(allow_null=True)


class ErrorSerializer(serializers.Serializer):
    """Every error of the platform: OpenAI's shape, with a stable `code`."""

    error = ErrorDetailSerializer()


ERROR = ErrorSerializer
MANAGEMENT_API_PREFIX = "/api/v1/"


def management_endpoints_only(endpoints: list, **kwargs) -> list:
    """drf-spectacular's preprocessing hook: the endpoints under /api/v1/ only."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith(MANAGEMENT_API_PREFIX)]


class ManagementAutoSchema(AutoSchema):
    """Adds the error responses an operation can give to those its view declares."""

    def get_description(self) -> str:
        # The view's own docstring only: drf-spectacular's would be the one a view without its
        # own inherits from its mixins, which describes the mixin, not the operation.
        return inspect.cleandoc(type(self.view).__doc__ or "")

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code, description in self._errors().items():
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ERROR, description=description), code, direction=direction
                )
        return responses

    def _errors(self) -> dict[str, str]:
        view_permissions = self.view.get_permissions()
        operator = any(getattr(p, "operators_only", False) for p in view_permissions)
        owner_only = any(getattr(p, "owners_only", False) for p in view_permissions)
        writes = self.method not in permissions.SAFE_METHODS
        errors = {}
        has_body = self.method in ("POST", "PUT", "PATCH") and self._get_request_body()
        if has_body or (self._is_list_view() and self._get_paginator()):
            errors["400"] = "Malformed input: a field, a filter or the cursor (`param` names it)."
        errors["401"] = "No valid management token or session, or an API key was sent."
        if writes:
            errors["403"] = "A read-only token, a session without its CSRF token" + (
                ", or a member where only owners may change this." if owner_only else "."
            )
        errors["404"] = (
            "Not found, or the caller is not an operator (operators only)."
            if operator
            else "Not found in the caller's tenant; another tenant's objects are never found."
        )
        return errors
