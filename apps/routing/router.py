"""Pick the node that serves a request."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from apps.hardware.fleet import NodeSnapshot
from apps.routing.fleet import FleetView


@dataclass(frozen=True, slots=True)
class Decision:
    node: NodeSnapshot
    candidates: int
    reason: str


def choose(fleet: FleetView, *, model: str, exclude: Collection[int] = ()) -> Decision | None:
    """Return the least-loaded live node for the model, or None when none can serve."""
    candidates = [node for node in fleet.live_nodes(model) if node.id not in exclude]
    if not candidates:
        return None

    def load(node: NodeSnapshot) -> tuple[int, float]:
        queued = node.num_requests_running + node.num_requests_waiting + fleet.inflight[node.id]
        return queued, node.kv_cache_usage

    best = min(candidates, key=load)
    queued, kv = load(best)
    return Decision(
        node=best,
        candidates=len(candidates),
        reason=f"least loaded of {len(candidates)}: {queued} queued, kv {kv:.0%}",
    )
