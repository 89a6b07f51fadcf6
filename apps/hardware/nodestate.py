"""Live node state: one Redis hash of NodeSnapshots, written by this app on every heartbeat.

Gateways poll it (routing's FleetView, apps.routing.fleet) instead of the database, so routing
never waits on SQL. The snapshot type lives with its writer: routing sits above hardware and
reads it; hardware, which registers nodes and takes their heartbeats, must not import routing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Self

import orjson

from apps.hardware.choices import NodeStatus
from dmxplatform.records import JsonRecord, from_fields
from dmxplatform.redis_client import rkey
from inference.wire import EngineLoad

FLEET_KEY = ("fleet", "nodes")


@dataclass(frozen=True, slots=True)
class NodeSnapshot(JsonRecord):
    id: int
    name: str
    url: str
    status: str
    model: str
    version_id: int
    version_tag: str
    served_model_name: str
    max_model_len: int
    heartbeat_at: float
    token_id: int = 0  # the NodeToken that registered it: heartbeats must come with the same
    # An operator drained it (Node.drained): no new requests, in-flight ones finish. Heartbeats
    # keep it, since they change only what the worker reports.
    drained: bool = False
    # The engine's load as its last heartbeat reported it (the wire type itself, so that the
    # protocol and the snapshot grow together).
    engine: EngineLoad = field(default_factory=EngineLoad)
    profile: str | None = None
    # The engine runs vLLM's priority scheduler, so requests may carry a priority.
    priority_scheduling: bool = False
    # Requests the engine runs at once (vLLM's --max-num-seqs); more wait in its queue. 0: unknown.
    max_num_seqs: int = 0
    # Hardware, summarised from the node's resource view (apps.hardware.resources).
    gpu_count: int = 0
    memory_used_fraction: float = 0.0
    gpu_utilization: float = 0.0
    memory_bandwidth_utilization: float = 0.0
    temperature_c: float = 0.0
    hourly_price_usd: float = 0.0

    @classmethod
    def decode(cls, raw: bytes) -> Self:
        """Raises ValueError or TypeError for an entry that is not a snapshot (readers skip it)."""
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise TypeError(f"a node snapshot is a JSON object, not {type(data).__name__}")
        data["engine"] = from_fields(EngineLoad, data.get("engine") or {})
        return from_fields(cls, data)

    def is_up(self, *, now: float, stale_after: float) -> bool:
        """It says it is up and its last heartbeat is recent."""
        return self.status == NodeStatus.UP and now - self.heartbeat_at <= stale_after

    def is_live(self, *, now: float, stale_after: float) -> bool:
        """True when the node takes new requests: up, and no operator drained it."""
        return not self.drained and self.is_up(now=now, stale_after=stale_after)


def fleet_key() -> str:
    return rkey(*FLEET_KEY)


def fleet_resources_key() -> str:
    """Each node's latest resource view (GPU readings) as it sent it, for its Node row."""
    return rkey("fleet", "resources")


def node_token_key(token_id: str) -> str:
    return rkey("nodetoken", token_id)


@dataclass(frozen=True, slots=True)
class TokenRecord(JsonRecord):
    """A node token as authentication needs it; cached in Redis so heartbeats need no SQL."""

    id: int
    token_id: str
    secret_hash: str
    revoked: bool


def now() -> float:
    """Wall-clock seconds; heartbeats are compared across processes, so not monotonic."""
    return time.time()
