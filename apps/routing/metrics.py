"""The fleet as routing sees it, for Prometheus: read from Redis at scrape time, not kept.

Routing decides on these numbers (apps.routing.router); exporting them shows an operator why it
decided as it did. They are read from the fleet state every gateway shares, so any process's
/metrics gives the same answer. The heartbeat's age is the one to alert on: a node whose
heartbeats lag is routed on old load, and past DMX_NODE_STALE_SECONDS it gets no traffic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily, StateSetMetricFamily

from apps.hardware.nodestate import NodeSnapshot, now
from apps.hardware.resources import node_view
from apps.hardware.selectors import fleet_read_decode, fleet_read_queue
from apps.routing.breaker import CLOSED, Breaker, BreakerState, breakers_key
from dmxplatform.metrics import ScrapeTimeCollector
from dmxplatform.redis_client import REDIS_ERRORS, request_redis, sync_redis

_NODE = ["node", "model", "status"]
_GPU = ["node", "gpu"]
MIB = 1024 * 1024


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class FleetCollector(ScrapeTimeCollector):
    def collect(self) -> Iterator[GaugeMetricFamily | StateSetMetricFamily]:
        try:
            breakers_raw = request_redis().hgetall(breakers_key())
            pipe = sync_redis().pipeline(transaction=False)
            fleet_read_queue(pipe)
            fleet_replies = pipe.execute()
        except REDIS_ERRORS:
            return  # no figures rather than a failed scrape; Redis has its own alerts
        fleet = fleet_read_decode(*fleet_replies)
        nodes = list(fleet.snapshots.values())
        yield from self._nodes(nodes)
        yield self._breakers(nodes, breakers_raw)
        yield from self._gpus(nodes, fleet.resources)

    def _nodes(self, nodes: list[NodeSnapshot]) -> Iterator[GaugeMetricFamily]:
        families = {
            "age": _gauge(
                "dmx_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat.", _NODE
            ),
            "running": _gauge(
                "dmx_node_requests_running",
                "Requests the node's engine was running at its last heartbeat.",
                _NODE,
            ),
            "waiting": _gauge(
                "dmx_node_requests_waiting",
                "Requests waiting in the node's engine queue at its last heartbeat.",
                _NODE,
            ),
            "kv": _gauge(
                "dmx_node_kv_cache_usage_ratio",
                "Share of the node's KV cache in use at its last heartbeat.",
                _NODE,
            ),
            "drained": _gauge(
                "dmx_node_drained", "1 when an operator drained the node (no new requests).", _NODE
            ),
            "live": _gauge(
                "dmx_node_up",
                "1 when the node takes new requests: up, heartbeats fresh, not drained.",
                _NODE,
            ),
        }
        t = now()
        stale = settings.DMX_NODE_STALE_SECONDS
        for node in nodes:
            labels = [node.name, node.model, node.status]
            families["age"].add_metric(labels, max(t - node.heartbeat_at, 0.0))
            families["running"].add_metric(labels, node.engine.num_requests_running)
            families["waiting"].add_metric(labels, node.engine.num_requests_waiting)
            families["kv"].add_metric(labels, node.engine.kv_cache_usage)
            families["drained"].add_metric(labels, float(node.drained))
            families["live"].add_metric(labels, float(node.is_live(now=t, stale_after=stale)))
        yield from families.values()
        yield GaugeMetricFamily(
            "dmx_node_stale_after_seconds",
            "Heartbeat age past which a node gets no traffic (DMX_NODE_STALE_SECONDS).",
            value=stale,
        )

    def _breakers(self, nodes: list[NodeSnapshot], raw: dict[bytes, bytes]) -> StateSetMetricFamily:
        family = StateSetMetricFamily(
            "dmx_node_breaker_state",
            "The node's circuit breaker: closed (traffic flows), open (none) or half_open (one "
            "probe request).",
            labels=["node"],
        )
        t = now()
        cooldown = settings.DMX_BREAKER_COOLDOWN_SECONDS
        for node in nodes:
            stored = raw.get(str(node.id).encode())
            breaker = Breaker.parse(stored) if stored else CLOSED
            state = breaker.current(t, cooldown)
            family.add_metric([node.name], {s.value: s is state for s in BreakerState})
        return family

    def _gpus(
        self, nodes: list[NodeSnapshot], resources: dict[int, dict[str, Any]]
    ) -> Iterator[GaugeMetricFamily]:
        families = {
            "used": _gauge("dmx_gpu_memory_used_bytes", "GPU memory in use.", _GPU),
            "total": _gauge("dmx_gpu_memory_total_bytes", "GPU memory in all.", _GPU),
            "busy": _gauge(
                "dmx_gpu_utilization_ratio",
                "Share of the last sample period in which a kernel ran (NVML).",
                _GPU,
            ),
            "bandwidth": _gauge(
                "dmx_gpu_memory_bandwidth_utilization_ratio",
                "Share of the last sample period in which device memory was read or written.",
                _GPU,
            ),
            "temperature": _gauge("dmx_gpu_temperature_celsius", "GPU temperature.", _GPU),
            "power": _gauge("dmx_gpu_power_draw_watts", "GPU power draw.", _GPU),
            "clocks": _gauge(
                "dmx_gpu_clock_event_active",
                "1 for each reason the GPU's clocks are held back now (NVML's clock event "
                "reasons: gpu_idle, sw_power_cap, hw_slowdown, sw/hw_thermal_slowdown, ...).",
                [*_GPU, "reason"],
            ),
        }
        for node in nodes:
            view = node_view(resources.get(node.id, {}))
            if view is None:
                continue
            for gpu in view.gpus:
                labels = [node.name, str(gpu.index)]
                readings = (
                    ("used", gpu.memory_used_mb and gpu.memory_used_mb * MIB),
                    ("total", gpu.memory_total_mb and gpu.memory_total_mb * MIB),
                    ("busy", gpu.gpu_utilization),
                    ("bandwidth", gpu.memory_bandwidth_utilization),
                    ("temperature", gpu.temperature_c),
                    ("power", gpu.power_draw_w),
                )
                for family, value in readings:
                    if value is not None:
                        families[family].add_metric(labels, value)
                for reason in gpu.throttle_reasons or ():
                    families["clocks"].add_metric([*labels, reason], 1.0)
        yield from families.values()
