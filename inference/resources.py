"""What this node has: the view sent with registration and every heartbeat."""

from __future__ import annotations

import os


def _meminfo_mb() -> dict[str, int]:
    values = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) // 1024
    except OSError:
        pass
    return values


def cpu_view() -> dict:
    """Return the CPU node's view: cores and memory."""
    memory = _meminfo_mb()
    return {
        "kind": "cpu",
        "cpu_count": os.cpu_count() or 1,
        "memory_total_mb": memory.get("MemTotal", 0),
        "memory_available_mb": memory.get("MemAvailable", 0),
    }
