"""One error hierarchy for the whole platform, rendered in OpenAI's error shape.

Every error a client sees is `{"error": {"message", "type", "param", "code"}}` with a stable
`code`; apps subclass these and name their codes in an enum of their own (`apps/*/errors.py`).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from redis.exceptions import RedisClusterException, RedisError
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ApplicationError(Exception):
    """An error with an HTTP status and an OpenAI-shaped body."""

    status: int = 500
    error_type: str = "server_error"
    default_code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        if error_type is not None:
            self.error_type = error_type
        self.param = param
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        """Return the OpenAI error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        """Return the OpenAI error body as JSON bytes."""
        return orjson.dumps(self.to_dict())


class InvalidRequestError(ApplicationError):
    status = 400
    error_type = "invalid_request_error"
    default_code = "invalid_request"


class AuthenticationError(ApplicationError):
    # OpenAI answers a bad key with type invalid_request_error; clients match on the code.
    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(ApplicationError):
    status = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"


class NotFoundError(ApplicationError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowedError(ApplicationError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class RequestTimeoutError(ApplicationError):
    status = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class ConflictError(ApplicationError):
    status = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class RequestTooLargeError(ApplicationError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimitError(ApplicationError):
    status = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"


class UpstreamError(ApplicationError):
    status = 502
    error_type = "server_error"
    default_code = "upstream_error"


class GatewayTimeoutError(ApplicationError):
    status = 504
    error_type = "server_error"
    default_code = "request_timeout"


class ServiceUnavailableError(ApplicationError):
    status = 503
    error_type = "server_error"
    default_code = "service_unavailable"


class UpstreamUnavailableError(ServiceUnavailableError):
    """Every node tried failed before it answered: no capacity now, so try again (with
    Retry-After), where a 502 would say the request itself went wrong."""

    default_code = "upstream_unavailable"


def _flatten_detail(detail: Any, prefix: str = "") -> tuple[str, str | None]:
    """Return the first message in a DRF error detail and the field it belongs to."""
    if isinstance(detail, dict):
        for field, value in detail.items():
            name = field if field != "non_field_errors" else ""
            param = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return _flatten_detail(value, param)
    if isinstance(detail, list) and detail:
        return _flatten_detail(detail[0], prefix)
    return str(detail), (prefix or None)


_DRF_STATUS_TO_ERROR: dict[int, type[ApplicationError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    429: RateLimitError,
}


def _from_django(exc: Exception) -> Exception:
    """DRF's own handler turns Django's 404 and 403 into its exceptions; so do we, and a model
    validation error (a service's full_clean) into a 400 naming its field."""
    from django.core.exceptions import PermissionDenied, ValidationError
    from django.http import Http404

    if isinstance(exc, Http404):
        return drf_exceptions.NotFound()
    if isinstance(exc, PermissionDenied):
        return drf_exceptions.PermissionDenied()
    if isinstance(exc, ValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        return drf_exceptions.ValidationError(detail)
    return exc


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render DRF and application errors of the internal and portal APIs in OpenAI's shape."""
    exc = _from_django(exc)
    if isinstance(exc, ApplicationError):
        return Response(exc.to_dict(), status=exc.status, headers=exc.headers)
    if isinstance(exc, (RedisError, RedisClusterException)):
        # Live figures (quota and budget counters) come from Redis: away, the answer is a
        # retryable 503, as the gateway's is, not a server error.
        logger.warning("Redis unavailable in %s: %s", context.get("view"), exc)
        error = ServiceUnavailableError(
            "Live usage figures are unavailable right now. Please retry shortly.",
            code="store_unavailable",
            headers={"Retry-After": "2"},
        )
        return Response(error.to_dict(), status=error.status, headers=error.headers)
    if isinstance(exc, drf_exceptions.APIException):
        message, param = _flatten_detail(exc.detail)
        # Another client error (406, 415) is still the client's, not a server_error.
        fallback = InvalidRequestError if exc.status_code < 500 else ApplicationError
        error_class = _DRF_STATUS_TO_ERROR.get(exc.status_code, fallback)
        code = None if isinstance(exc, drf_exceptions.ValidationError) else exc.default_code
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        error = error_class(message, param=param, code=code, headers=headers)
        return Response(error.to_dict(), status=exc.status_code, headers=error.headers)
    # A bug, not bad input: log it whole, answer in the API's shape rather than an HTML page.
    logger.error("unhandled error in %s", context.get("view"), exc_info=exc)
    error = ApplicationError("The server had an error while processing your request.")
    return Response(error.to_dict(), status=error.status)
