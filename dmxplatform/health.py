"""`/health`: is this process able to serve? Checks the database and Redis, each bounded."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from dmxplatform.redis_client import sync_redis


def _check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # any failure means "not healthy", reported, not raised
        return f"error: {exc.__class__.__name__}"


def _check_redis() -> str:
    try:
        sync_redis().ping()
        return "ok"
    except Exception as exc:
        return f"error: {exc.__class__.__name__}"


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    checks = {"database": _check_database(), "redis": _check_redis()}
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", **checks}, status=200 if healthy else 503
    )
