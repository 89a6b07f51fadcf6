"""Who is calling: the client's IP address, seen through trusted proxies only."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import cache
from typing import Any

from dmxplatform.responses import header

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@cache
def trusted_networks(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def is_trusted(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(scope: dict[str, Any], trusted: Sequence[Network]) -> str | None:
    """Return the caller's address: the peer, or, behind trusted proxies, the nearest address
    in X-Forwarded-For that is not one of them (clients can forge the rest of the list)."""
    peer = scope["client"][0] if scope.get("client") else None
    forwarded = header(scope, b"x-forwarded-for")
    return forwarded_address(peer, forwarded.decode("latin-1") if forwarded else None, trusted)


def forwarded_address(
    peer: str | None, forwarded: str | None, trusted: Sequence[Network]
) -> str | None:
    """client_address from the peer's address and the X-Forwarded-For header's value."""
    if peer is None or not trusted or not is_trusted(peer, trusted):
        return peer
    if not forwarded:
        return peer
    for hop in reversed([h.strip() for h in forwarded.split(",")]):
        if hop and not is_trusted(hop, trusted):
            return hop
    return peer
