"""The fleet as this gateway process sees it, for Prometheus: read at scrape time, not kept.

Routing decides on these numbers (apps.routing.router); exporting them shows an operator why
it decided as it did. The heartbeat's age is the one to alert on: a node whose heartbeats lag
is routed on old load, and past DMX_NODE_STALE_SECONDS it gets no traffic at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from apps.hardware.fleet import now
from apps.routing.fleet import FleetView

_LABELS = ["node", "model", "status"]


class FleetCollector(Collector):
    def __init__(self) -> None:
        self.fleet: FleetView | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.fleet is None:
            return
        families = {
            "age": GaugeMetricFamily(
                "dmx_node_heartbeat_age_seconds",
                "Seconds since the node's last heartbeat, as this gateway last read it.",
                labels=_LABELS,
            ),
            "running": GaugeMetricFamily(
                "dmx_node_requests_running",
                "Requests the node's engine was running at its last heartbeat.",
                labels=_LABELS,
            ),
            "waiting": GaugeMetricFamily(
                "dmx_node_requests_waiting",
                "Requests waiting in the node's engine queue at its last heartbeat.",
                labels=_LABELS,
            ),
            "kv": GaugeMetricFamily(
                "dmx_node_kv_cache_usage_ratio",
                "Share of the node's KV cache in use at its last heartbeat.",
                labels=_LABELS,
            ),
            "inflight": GaugeMetricFamily(
                "dmx_node_gateway_inflight_requests",
                "Requests this gateway process has in flight on the node.",
                labels=_LABELS,
            ),
        }
        t = now()
        inflight = self.fleet.inflight
        for node in self.fleet.all_nodes():
            labels = [node.name, node.model, node.status]
            families["age"].add_metric(labels, max(t - node.heartbeat_at, 0.0))
            families["running"].add_metric(labels, node.num_requests_running)
            families["waiting"].add_metric(labels, node.num_requests_waiting)
            families["kv"].add_metric(labels, node.kv_cache_usage)
            families["inflight"].add_metric(labels, inflight.get(node.id, 0))
        yield from families.values()


_collector: FleetCollector | None = None


def export_fleet(fleet: FleetView) -> None:
    """Serve this fleet view at /metrics: the process's gateway runtime calls it as it starts."""
    global _collector
    if _collector is None:
        _collector = FleetCollector()
        REGISTRY.register(_collector)
    _collector.fleet = fleet
