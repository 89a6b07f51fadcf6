from __future__ import annotations

import dataclasses
import itertools
import time

import msgspec

from apps.hardware.nodestate import NodeSnapshot
from apps.models.catalog import ModelEntry, VersionEntry
from apps.routing.breaker import BreakerBoard
from apps.routing.fleet import FleetView, Ticket
from apps.routing.router import Router, RouteRequest
from apps.routing.stats import GatewayStats
from inference.wire import EngineLoad

_ids = itertools.count(1)


def occupy(
    fleet: FleetView, node: NodeSnapshot, count: int, *, prompt_tokens: int = 1_000
) -> list[Ticket]:
    """`count` requests this process sent `node` and has not finished, recorded as the
    dispatcher records them (FleetView.begin)."""
    return [
        fleet.begin(node.id, prompt_tokens=prompt_tokens, completion_tokens=100)
        for _ in range(count)
    ]


_ENGINE_FIELDS = frozenset(EngineLoad.__struct_fields__)


def with_engine(snapshot: NodeSnapshot, **changes) -> NodeSnapshot:
    """The snapshot with `changes`, its engine load's fields among them."""
    engine = {name: changes.pop(name) for name in list(changes) if name in _ENGINE_FIELDS}
    if engine:
        changes["engine"] = msgspec.structs.replace(snapshot.engine, **engine)
    return dataclasses.replace(snapshot, **changes)


def make_snapshot(**overrides) -> NodeSnapshot:
    """A node's snapshot; engine load fields (num_requests_running, kv_cache_usage...) may be
    given among the others."""
    engine = {name: overrides.pop(name) for name in list(overrides) if name in _ENGINE_FIELDS}
    node_id = overrides.pop("id", next(_ids))
    fields = dict(
        id=node_id,
        name=f"node-{node_id}",
        url=f"http://10.0.0.{node_id}:8000",
        status="up",
        model="m",
        version_id=1,
        version_tag="v1",
        served_model_name="m",
        max_model_len=4096,
        heartbeat_at=time.time(),
    )
    fields.update(overrides)
    return NodeSnapshot(**fields, engine=EngineLoad(**engine))


def make_model_entry(versions=None, **overrides) -> ModelEntry:
    fields = dict(
        id=1,
        name="m",
        owned_by="dmx",
        created=0,
        max_context_tokens=4096,
        versions=versions or {1: VersionEntry(id=1, tag="v1", is_stable=True, canary_percent=0.0)},
        counter=None,
    )
    fields.update(overrides)
    return ModelEntry(**fields)


def make_fleet(*nodes: NodeSnapshot, stale_after: float = 10.0) -> FleetView:
    fleet = FleetView(stale_after=stale_after)
    fleet.replace({str(n.id).encode(): n.encode() for n in nodes})
    return fleet


def heartbeat(fleet: FleetView, *nodes: NodeSnapshot) -> None:
    """The nodes' next heartbeat, as they are: it counts the requests sent them so far."""
    fleet.replace(
        {
            str(n.id).encode(): dataclasses.replace(n, heartbeat_at=n.heartbeat_at + 1).encode()
            for n in nodes
        }
    )


class NoRedis:
    """The breaker board's Redis client is not used by decisions; nothing may call it."""

    def register_script(self, script):
        return None


def make_router(*nodes: NodeSnapshot, weights=None) -> Router:
    return Router(
        fleet=make_fleet(*nodes),
        breakers=BreakerBoard(NoRedis()),
        stats=GatewayStats(),
        weights=weights,
    )


def route_request(model: ModelEntry | None = None, **overrides) -> RouteRequest:
    fields = dict(
        request_id="req_" + "0" * 24 + f"{next(_ids):08x}",
        model=model or make_model_entry(),
        prompt_tokens=100,
        completion_tokens=100,
        max_tokens=100,
    )
    fields.update(overrides)
    return RouteRequest(**fields)
