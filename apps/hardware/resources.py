"""A node's resource view (sent by its worker) summarised into the few numbers routing uses."""

from __future__ import annotations

from typing import Any


def summarize(resources: dict[str, Any]) -> dict[str, float | int]:
    """Return the NodeSnapshot hardware fields for a resource view."""
    if resources.get("kind") == "cpu":
        total = resources.get("memory_total_mb") or 0
        available = resources.get("memory_available_mb") or 0
        used = 1.0 - available / total if total else 0.0
        return {"gpu_count": 0, "memory_used_fraction": round(used, 4)}
    return {}
