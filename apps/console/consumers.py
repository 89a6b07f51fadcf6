"""The fleet dashboard's WebSocket (/ws/console/fleet): the page's nodes and charts, kept live.

Two sources, each for what it suits:
- Nodes change with every heartbeat, which already passes through a gateway process: the
  heartbeat pushes the node's new state into a channel-layer group (apps.hardware.broadcast)
  that every open dashboard joins, so a row changes within a heartbeat of the engine's and no
  dashboard polls Redis for what did not change. Pushes are gathered for NODE_PUSH_SECONDS, so
  that a large fleet costs a page a message twice a second, not one per heartbeat.
- The model charts come from the usage records, which reach PostgreSQL in batches (the ledger
  flush) rather than one at a time: there is no one moment to push them from, so the consumer
  reads them again every REFRESH_SECONDS, and every node with them, which also heals a missed
  push and shows nodes whose heartbeats stopped.

Only staff who may view nodes and usage get in (apps.console.dashboard.dashboard_permitted); the
session cookie signs them in (AuthMiddlewareStack in config.asgi), anyone else is refused
at the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.console.dashboard import dashboard_permitted, fleet_state, nodes_update
from apps.hardware.broadcast import NODE_UPDATES_GROUP
from apps.hardware.nodestate import NodeSnapshot
from apps.hardware.selectors import LOGGED_BYTES, UNREADABLE

logger = logging.getLogger(__name__)

# How often the charts (and every node) are read again: the ledger flushes every 2 s by default,
# and a minute's point moves little faster than this. One query of the last hour each time.
REFRESH_SECONDS = 5.0
# Heartbeat pushes gathered into one message to the page at most this often.
NODE_PUSH_SECONDS = 0.5


class FleetDashboardConsumer(AsyncJsonWebsocketConsumer):
    refresher: asyncio.Task | None = None
    pusher: asyncio.Task | None = None
    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(dashboard_permitted)(user):
            await self.close()  # before accept: the handshake is refused with 403
            return
        self.pending: dict[int, NodeSnapshot] = {}
        await self.channel_layer.group_add(NODE_UPDATES_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        self.refresher = asyncio.ensure_future(self._refresh())

    async def disconnect(self, code: int) -> None:
        for task in (self.refresher, self.pusher):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.joined:
            await self.channel_layer.group_discard(NODE_UPDATES_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs) -> None:
        """The page only listens; anything it sends is ignored."""

    async def node_update(self, event: dict[str, Any]) -> None:
        """A heartbeat's node state (apps.hardware.broadcast): sent on with the others that
        come within NODE_PUSH_SECONDS, the latest of each node."""
        try:
            snapshot = NodeSnapshot.decode(event["snapshot"])
        except UNREADABLE:
            # A newer release's heartbeat, say, mid-deploy: the next refresh shows the node.
            logger.warning("unreadable node update: %r", str(event)[:LOGGED_BYTES])
            return
        self.pending[snapshot.id] = snapshot
        if self.pusher is None or self.pusher.done():
            self.pusher = asyncio.ensure_future(self._push_nodes())

    async def _push_nodes(self) -> None:
        await asyncio.sleep(NODE_PUSH_SECONDS)
        snapshots, self.pending = list(self.pending.values()), {}
        await self.send_json(nodes_update(snapshots))

    async def _refresh(self) -> None:
        while True:
            try:
                state = await database_sync_to_async(fleet_state)()
            except (DatabaseError, RedisError) as exc:
                # The page keeps what it has, and says how old it is; the next round may work.
                logger.warning("fleet dashboard not refreshed: %s", exc)
            except Exception:
                # Anything else is a bug, but one round's: a task that died here would leave
                # the page frozen with nothing said anywhere.
                logger.exception("fleet dashboard not refreshed")
            else:
                await self.send_json(state)
            await asyncio.sleep(REFRESH_SECONDS)
