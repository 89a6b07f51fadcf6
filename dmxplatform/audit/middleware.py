"""auditlog's middleware, with the caller's address found the way the gateway finds it.

auditlog's own takes the first X-Forwarded-For entry, which any client can write: an entry
could then name whatever address its actor liked. Here the header counts only when the peer
is one of DMX_TRUSTED_PROXIES, and then only its nearest hop that is not one of them.
"""

from __future__ import annotations

import ipaddress

from auditlog.middleware import AuditlogMiddleware
from django.conf import settings
from django.http import HttpRequest

from dmxplatform.clients import Network, forwarded_address, is_trusted, trusted_networks


def _peer(request: HttpRequest) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def _proxies() -> tuple[Network, ...]:
    return trusted_networks(tuple(settings.DMX_TRUSTED_PROXIES))


class TrustedProxyAuditlogMiddleware(AuditlogMiddleware):
    """auditlog's middleware, believing X-Forwarded-For and -Port from trusted proxies only."""

    @staticmethod
    def _get_remote_addr(request: HttpRequest) -> str | None:
        if settings.AUDITLOG_DISABLE_REMOTE_ADDR:
            return None
        address = forwarded_address(
            _peer(request),
            request.headers.get("X-Forwarded-For"),
            _proxies(),
        )
        try:
            # The entry's column is an IP address: a proxy's garbage would fail the write.
            return str(ipaddress.ip_address(address)) if address else None
        except ValueError:
            return None

    @staticmethod
    def _get_remote_port(request: HttpRequest) -> int | None:
        peer = _peer(request)
        if peer is None or not is_trusted(peer, _proxies()):
            return None
        return AuditlogMiddleware._get_remote_port(request)
