"""The fleet dashboard (admin: Platform -> Fleet dashboard): every node's live state and every
model's and intent's last hour, on one page the browser keeps live over a WebSocket
(apps.console.consumers).

The figures are the hardware and keys apps' (their selectors); this module only puts them into
the one shape the page draws, for the page's first paint and for every update after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from apps.billing.selectors import usage_by_intent, usage_minute_series
from apps.hardware.nodestate import NodeSnapshot, now
from apps.hardware.selectors import node_states

# Who sees the dashboard: staff who may view nodes and usage records (the viewer and operator
# groups, superusers).
DASHBOARD_PERMISSIONS = ("hardware.view_node", "billing.view_usagerecord")
# The page's WebSocket (config.asgi routes it to apps.console.consumers).
FLEET_SOCKET_PATH = "ws/console/fleet"
# The minutes on the charts' axis, in UTC as everything in the admin.
MINUTE_LABEL = "%H:%M"


def dashboard_permitted(user: Any) -> bool:
    """True when `user` may see the fleet dashboard."""
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perms(DASHBOARD_PERMISSIONS)
    )


def node_row(snapshot: NodeSnapshot) -> dict[str, Any]:
    """What a node's row shows that its heartbeats change."""
    return {
        "id": snapshot.id,
        "name": snapshot.name,
        "model": snapshot.model,
        "version": snapshot.version_tag,
        "profile": snapshot.profile,
        "status": snapshot.status,
        "drained": snapshot.drained,
        "gpu_count": snapshot.gpu_count,
        # Of the fullest GPU (host memory on a CPU node), as routing reads it.
        "memory_used": snapshot.memory_used_fraction,
        "gpu_utilization": snapshot.gpu_utilization,
        "bandwidth_utilization": snapshot.memory_bandwidth_utilization,
        "temperature_c": snapshot.temperature_c,
        "running": snapshot.engine.num_requests_running,
        "waiting": snapshot.engine.num_requests_waiting,
        "kv_cache": snapshot.engine.kv_cache_usage,
        "heartbeat_at": snapshot.heartbeat_at,
    }


def fleet_state() -> dict[str, Any]:
    """Everything the page shows: every node (its row, and its hardware in words) and every
    model's figures per minute over the last hour, and every intent's over the hour. `now`
    (wall-clock seconds) lets the browser count heartbeat ages on the server's clock."""
    series = usage_minute_series()
    return {
        "type": "fleet",
        "now": now(),
        "stale_after": settings.DMX_NODE_STALE_SECONDS,
        "nodes": [
            {
                **node_row(state.snapshot),
                "gpus": state.hardware.gpus,
                "memory": state.hardware.memory,
            }
            for state in node_states()
        ],
        "minutes": [minute.strftime(MINUTE_LABEL) for minute in series.minutes],
        "models": {name: dataclasses.asdict(figures) for name, figures in series.models.items()},
        "intents": [dataclasses.asdict(figures) for figures in usage_by_intent()],
    }


def nodes_update(snapshots: list[NodeSnapshot]) -> dict[str, Any]:
    """The message that brings the page the nodes whose heartbeats came since the last one."""
    return {"type": "nodes", "now": now(), "nodes": [node_row(s) for s in snapshots]}


def fleet_dashboard_view(request: HttpRequest) -> HttpResponse:
    """The page, drawn from the fleet's state now; its script keeps it live from there."""
    if not dashboard_permitted(request.user):
        raise PermissionDenied
    context = {
        **admin.site.each_context(request),
        "title": "Fleet dashboard",
        "state": fleet_state(),
        "socket_path": f"/{FLEET_SOCKET_PATH}",
    }
    return TemplateResponse(request, "admin/console/dashboard.html", context)
