"""Each gateway process's in-memory copy of live node state, refreshed from Redis."""

from __future__ import annotations

from collections import defaultdict

from apps.hardware.fleet import NodeSnapshot, now


class FleetView:
    """Nodes by model, plus the requests this process has in flight on each node.

    The heartbeat load is up to a refresh interval old; counting our own in-flight requests on
    top keeps a burst from piling onto the node that looked idle at the last refresh.
    """

    def __init__(self, *, stale_after: float) -> None:
        self._stale_after = stale_after
        self._by_model: dict[str, list[NodeSnapshot]] = {}
        self.inflight: defaultdict[int, int] = defaultdict(int)

    def replace(self, raw: dict[bytes, bytes]) -> None:
        """Swap in the nodes read from the fleet hash."""
        by_model: dict[str, list[NodeSnapshot]] = defaultdict(list)
        for value in raw.values():
            node = NodeSnapshot.decode(value)
            by_model[node.model].append(node)
        self._by_model = dict(by_model)

    def live_nodes(self, model: str) -> list[NodeSnapshot]:
        """Nodes serving `model` that are up and have sent a recent heartbeat."""
        t = now()
        return [
            n
            for n in self._by_model.get(model, ())
            if n.is_live(now=t, stale_after=self._stale_after)
        ]

    def live_models(self) -> set[str]:
        t = now()
        return {
            model
            for model, nodes in self._by_model.items()
            if any(n.is_live(now=t, stale_after=self._stale_after) for n in nodes)
        }

    def kv_pressure(self, model: str) -> float | None:
        """Mean KV-cache use of the live nodes serving `model`, or None when none is live."""
        nodes = self.live_nodes(model)
        if not nodes:
            return None
        return sum(node.kv_cache_usage for node in nodes) / len(nodes)
