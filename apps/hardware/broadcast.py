"""Each heartbeat's new node state, pushed to the console's live pages (the fleet dashboard)
through the channel layer.

A heartbeat must never fail or wait for this: the push is a task of its own on the serving event
loop, given a second, and dropped (logged) when it fails or when too many are still in flight.
Nothing is lost by a dropped push: the next heartbeat sends newer numbers, and the dashboard
reads every node again every few seconds by itself (apps.console.consumers).
"""

from __future__ import annotations

import asyncio
import logging

from channels.layers import get_channel_layer

from apps.hardware.nodestate import NodeSnapshot

logger = logging.getLogger(__name__)

# The channel-layer group of the pages that show nodes live.
NODE_UPDATES_GROUP = "hardware.node-updates"
# The message type those pages' consumers handle (a method node_update).
NODE_UPDATE = "node.update"
# A push that has not reached Redis by then is stale: a heartbeat comes every 2 s by default.
PUSH_TIMEOUT_SECONDS = 1.0
# Pushes in flight per process at most: a slow channel layer costs dropped pushes, never a pile
# of tasks on the loop that serves /v1. Far above what a process sees with Redis answering.
MAX_PUSHES_IN_FLIGHT = 100

_in_flight: set[asyncio.Task] = set()


def node_update_broadcast(snapshot: NodeSnapshot) -> None:
    """Push a node's new state to the live pages, without waiting for it; never raises."""
    if len(_in_flight) >= MAX_PUSHES_IN_FLIGHT:
        logger.warning(
            "node update of %s not pushed: %d pushes in flight", snapshot.name, len(_in_flight)
        )
        return
    task = asyncio.get_running_loop().create_task(_push(snapshot))
    _in_flight.add(task)  # a reference, so that the task is not collected before it ran
    task.add_done_callback(_in_flight.discard)


async def _push(snapshot: NodeSnapshot) -> None:
    try:
        layer = get_channel_layer()
        if layer is None:
            return  # no channel layer configured: nobody can be listening
        async with asyncio.timeout(PUSH_TIMEOUT_SECONDS):
            await layer.group_send(
                NODE_UPDATES_GROUP, {"type": NODE_UPDATE, "snapshot": snapshot.encode()}
            )
    except Exception as exc:  # a push is best effort: whatever went wrong, the heartbeat stands
        logger.warning("node update of %s not pushed: %r", snapshot.name, exc)
