"""A node's resource view (sent by its worker) summarised into the few numbers routing uses.

The view is inference.hardware.view.NodeView, the same structure for a CPU node and for eight
H200s; this module reads it for the fleet snapshot (summarize) and for the admin (describe).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from inference.hardware.view import NodeView
from inference.wire import WireError

logger = logging.getLogger(__name__)


def node_view(resources: dict[str, Any]) -> NodeView | None:
    """Parse a node's resources; None when it sent none or something this version cannot read."""
    if not resources:
        return None
    try:
        return NodeView.from_dict(resources)
    except WireError as exc:
        logger.warning("unreadable node resources (%s): %s", exc, str(resources)[:200])
        return None


def view_profile(resources: dict[str, Any]) -> str | None:
    """Return the hardware profile a node's view names: the CPU's, or its GPUs' most common."""
    view = node_view(resources)
    if view is None:
        return None
    if view.kind == "cpu":
        return view.profile.name if view.profile and not view.profile.generic else None
    names = Counter(
        gpu.profile.name for gpu in view.gpus if gpu.profile is not None and not gpu.profile.generic
    )
    return names.most_common(1)[0][0] if names else None


def summarize(
    resources: dict[str, Any], *, unit_price_usd: float | None = None
) -> dict[str, float | int]:
    """Return the NodeSnapshot hardware fields for a resource view.

    The price is `unit_price_usd` (the database's, per GPU, or per node without GPUs) times the
    GPUs when given, else the default prices of the profiles the worker matched.
    """
    view = node_view(resources)
    if view is None:
        return {}
    if view.kind == "cpu":
        used = (
            1.0 - view.memory_available_mb / view.memory_total_mb if view.memory_total_mb else 0.0
        )
        default = view.profile.hourly_price_usd if view.profile else 0.0
        return {
            "gpu_count": 0,
            "memory_used_fraction": round(used, 4),
            "hourly_price_usd": round(default if unit_price_usd is None else unit_price_usd, 4),
        }
    gpus = view.gpus
    memory = [f for f in (gpu.memory_used_fraction for gpu in gpus) if f is not None]
    busy = [gpu.gpu_utilization for gpu in gpus if gpu.gpu_utilization is not None]
    bandwidth = [
        gpu.memory_bandwidth_utilization
        for gpu in gpus
        if gpu.memory_bandwidth_utilization is not None
    ]
    temperatures = [gpu.temperature_c for gpu in gpus if gpu.temperature_c is not None]
    if unit_price_usd is not None:
        price = unit_price_usd * len(gpus)
    else:
        price = sum(gpu.profile.hourly_price_usd for gpu in gpus if gpu.profile is not None)
    return {
        "gpu_count": len(gpus),
        # The fullest GPU decides: tensor parallelism needs room on every one of them.
        "memory_used_fraction": round(max(memory, default=0.0), 4),
        "gpu_utilization": round(fmean(busy), 4) if busy else 0.0,
        "memory_bandwidth_utilization": round(max(bandwidth, default=0.0), 4),
        "temperature_c": float(max(temperatures, default=0)),
        "hourly_price_usd": round(price, 4),
    }


@dataclass(frozen=True, slots=True)
class NodeHardware:
    """A node's hardware in words, for the admin."""

    gpus: str
    memory: str
    bandwidth: str
    temperature: str
    nvlink: str


NOTHING = "-"


def describe(resources: dict[str, Any]) -> NodeHardware:
    """Return a node's view as short phrases: what it has, how full and hot, its NVLinks."""
    view = node_view(resources)
    if view is None:
        return NodeHardware(NOTHING, NOTHING, NOTHING, NOTHING, NOTHING)
    if view.kind == "cpu" or not view.gpus:
        used = view.memory_total_mb - view.memory_available_mb
        return NodeHardware(
            gpus=f"none ({view.cpu_count} CPU cores)",
            memory=f"{used / 1024:.1f} / {view.memory_total_mb / 1024:.1f} GiB host",
            bandwidth=NOTHING,
            temperature=NOTHING,
            nvlink=NOTHING,
        )
    names = Counter(gpu.name for gpu in view.gpus)
    summary = summarize(resources)
    total = sum(gpu.memory_total_mb or 0 for gpu in view.gpus)
    used = sum(gpu.memory_used_mb or 0 for gpu in view.gpus)
    links = [link for gpu in view.gpus for link in gpu.nvlinks]
    up = sum(link.active for link in links)
    if not links:
        nvlink = "none"
    elif up == len(links):
        nvlink = f"all {up} links up"
    else:
        nvlink = f"{len(links) - up} of {len(links)} links down"
    return NodeHardware(
        gpus=", ".join(f"{count} x {name}" for name, count in names.items()),
        memory=f"{used / 1024:.1f} / {total / 1024:.1f} GiB",
        bandwidth=f"{summary['memory_bandwidth_utilization']:.0%} (busiest GPU)",
        temperature=f"{summary['temperature_c']:.0f} C (hottest GPU)",
        nvlink=nvlink,
    )
