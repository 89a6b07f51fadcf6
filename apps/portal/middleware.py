"""The portal's answer when the request store (Redis) is away: its live figures (budgets' and
quotas' spend) and the writes that must reach the gateways (a credit to a prepaid balance, a
key's or a budget's change) need it. A page that says so and asks for a retry, with a 503 and
Retry-After, as the gateway and the management API answer, rather than a server error."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from redis.exceptions import RedisClusterException, RedisError

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2


class StoreUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        match = request.resolver_match
        if match is None or match.namespace != "portal":
            return None
        if not isinstance(exception, RedisError | RedisClusterException):
            return None
        logger.warning("portal %s without Redis: %s", match.view_name, exception)
        response = render(
            request, "portal/unavailable.html", {"retry_url": _retry_url(request)}, status=503
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


def _retry_url(request: HttpRequest) -> str:
    """The page again; after a form (a POST), the page the form was on."""
    if request.method == "GET":
        return request.get_full_path()
    came_from = request.headers.get("Referer", "")
    if url_has_allowed_host_and_scheme(
        came_from, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return came_from
    return reverse("portal:home")
