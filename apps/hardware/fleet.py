"""Live node state as gateways see it: one Redis hash, written on every heartbeat.

Gateways poll it (apps.routing.fleet) instead of the database, so routing never waits on SQL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from apps.hardware.choices import NodeStatus
from dmxplatform.records import JsonRecord
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
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
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
    # Engine statistics over the last heartbeat window (inference/engine_metrics.py).
    ttft_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    generation_tokens_per_second: float = 0.0

    def is_live(self, *, now: float, stale_after: float) -> bool:
        """True when the node takes new requests: it says it is up, its last heartbeat is
        recent, and no operator drained it."""
        return (
            self.status == NodeStatus.UP
            and not self.drained
            and now - self.heartbeat_at <= stale_after
        )


_ENGINE_FIELDS = tuple(
    f.name for f in fields(EngineLoad) if f.name in {g.name for g in fields(NodeSnapshot)}
)


def engine_fields(engine: EngineLoad) -> dict[str, object]:
    """The snapshot fields a heartbeat's engine load sets: every EngineLoad field the snapshot
    has, so the wire protocol and the snapshot grow together without a list kept in between."""
    return {name: getattr(engine, name) for name in _ENGINE_FIELDS}


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
