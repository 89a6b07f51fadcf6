"""Reads for hardware profiles, nodes and what the fleet serves."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db.models import QuerySet
from redis.client import Pipeline

from apps.hardware.models import HardwareProfile, Node
from apps.hardware.nodestate import NodeSnapshot, fleet_key, fleet_resources_key, now
from apps.hardware.resources import NodeHardware, describe
from apps.hardware.services import node_snapshot
from apps.models.selectors import llm_models_active
from dmxplatform.redis_client import sync_redis

logger = logging.getLogger(__name__)

# What an entry that will not decode raises (bad JSON is a ValueError too): a hand edit, a value
# cut short, a field written by a newer release than this process runs.
UNREADABLE = (ValueError, TypeError, KeyError)
# How much of an unreadable entry the warning shows.
LOGGED_BYTES = 200


def hardware_profile_list() -> QuerySet[HardwareProfile]:
    """Every profile: GPUs by name, then the CPU."""
    return HardwareProfile.objects.order_by("-kind", "name")


def hardware_profile_find(*, name: str) -> HardwareProfile | None:
    return HardwareProfile.objects.filter(name=name).first()


def node_list() -> QuerySet[Node]:
    """Every registered node, as the last nodes_sync left its row."""
    return Node.objects.select_related("model_version__model", "profile")


def _snapshots_decode(raws: Iterable[bytes]) -> dict[int, NodeSnapshot]:
    # One bad entry is skipped, not fatal: every reader of the fleet would fail on it, until the
    # node's next heartbeat overwrites it (or never, for a node that is gone).
    snapshots = {}
    for raw in raws:
        try:
            snapshot = NodeSnapshot.decode(raw)
        except UNREADABLE:
            logger.warning("unreadable fleet entry: %r", raw[:LOGGED_BYTES])
            continue
        snapshots[snapshot.id] = snapshot
    return snapshots


def _resources_decode(raws: dict[bytes, bytes]) -> dict[int, dict[str, Any]]:
    views = {}
    for node_id, raw in raws.items():
        try:
            view = orjson.loads(raw)
            if not isinstance(view, dict):
                raise TypeError("not an object")
            views[int(node_id)] = view
        except UNREADABLE:
            logger.warning("unreadable fleet resources of %r: %r", node_id, raw[:LOGGED_BYTES])
    return views


def fleet_snapshots() -> dict[int, NodeSnapshot]:
    """Every node's live state by id, as its last heartbeat left it (the rows lag a sync); an
    entry that does not decode is logged and left out."""
    return _snapshots_decode(sync_redis().hvals(fleet_key()))


@dataclass(frozen=True, slots=True)
class FleetReading:
    """The fleet's live state and each node's last resource view (its GPU readings), by id."""

    snapshots: dict[int, NodeSnapshot]
    resources: dict[int, dict[str, Any]]


def fleet_read_queue(pipe: Pipeline) -> None:
    """Queue on `pipe` the two reads fleet_read_decode takes the replies of, so that a caller
    reads the fleet along with its own keys in one round trip."""
    pipe.hgetall(fleet_key())
    pipe.hgetall(fleet_resources_key())


def fleet_read_decode(live: dict[bytes, bytes], views: dict[bytes, bytes]) -> FleetReading:
    """The replies of fleet_read_queue's reads, decoded; unreadable entries are logged and left
    out."""
    return FleetReading(
        snapshots=_snapshots_decode(live.values()), resources=_resources_decode(views)
    )


def fleet_read() -> FleetReading:
    """The fleet's live state and resource views, in one round trip."""
    pipe = sync_redis().pipeline(transaction=False)
    fleet_read_queue(pipe)
    return fleet_read_decode(*pipe.execute())


@dataclass(frozen=True, slots=True)
class ModelAvailability:
    name: str
    description: str
    owned_by: str
    kind: str  # apps.models.choices.ModelKind
    context_length: int
    served: bool  # a node takes its requests now


def models_available() -> list[ModelAvailability]:
    """Every active model, and whether a node takes its requests now (the live fleet state
    gateways route on, not the rows, which lag it by a sync)."""
    moment = now()
    served = {
        node.model
        for node in fleet_snapshots().values()
        if node.is_live(now=moment, stale_after=settings.DMX_NODE_STALE_SECONDS)
    }
    return [
        ModelAvailability(
            name=model.name,
            description=model.description,
            owned_by=model.owned_by,
            kind=model.kind,
            context_length=model.max_context_tokens,
            served=model.name in served,
        )
        for model in llm_models_active().order_by("name")
    ]


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as gateways see it now, with its hardware in words."""

    snapshot: NodeSnapshot
    hardware: NodeHardware


def node_states() -> list[NodeState]:
    """Every registered node by name: its live state (the Redis hash gateways route on; its
    row's where Redis has lost it) and the hardware of the resource view it sent last."""
    fleet = fleet_read()
    snapshots, resources = fleet.snapshots, fleet.resources
    # Rows only for what Redis lacks: a resource view is up to 21 KB (eight GPUs) a node.
    for node in node_list().exclude(id__in=snapshots.keys() & resources.keys()):
        if node.id not in snapshots:
            snapshots[node.id] = node_snapshot(node)
        resources.setdefault(node.id, node.resources)
    return [
        NodeState(snapshot=s, hardware=describe(resources.get(s.id) or {}))
        for s in sorted(snapshots.values(), key=lambda s: s.name)
    ]
