"""What this gateway saw of each node lately: P95 time to first token and end-to-end latency,
and the error rate, over a sliding window."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

# The window: long enough for a stable P95 at modest traffic, short enough to follow a change.
WINDOW_SECONDS = 60.0
# Samples kept per node at most, so a busy node costs bounded memory and sorting time.
MAX_SAMPLES = 512
# Below this many samples a window's percentile says more about chance than about the node.
MIN_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class WindowFigures:
    samples: int
    ttft_p95_ms: float | None
    latency_p95_ms: float | None
    error_rate: float


def _p95(values: list[float]) -> float | None:
    if len(values) < MIN_SAMPLES:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class NodeWindow:
    __slots__ = ("_figures", "_samples")

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float | None, float, bool]] = deque(maxlen=MAX_SAMPLES)
        self._figures: WindowFigures | None = None

    def add(self, at: float, ttft_ms: float | None, latency_ms: float, failed: bool) -> None:
        self._samples.append((at, ttft_ms, latency_ms, failed))
        self._figures = None

    def figures(self, now: float) -> WindowFigures:
        """The window's figures, computed once per change rather than per routing decision."""
        cutoff = now - WINDOW_SECONDS
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
            self._figures = None
        if self._figures is None:
            rows = self._samples
            ok = [row for row in rows if not row[3]]
            self._figures = WindowFigures(
                samples=len(rows),
                ttft_p95_ms=_p95([r[1] for r in ok if r[1] is not None]),
                latency_p95_ms=_p95([r[2] for r in ok]),
                error_rate=(sum(r[3] for r in rows) / len(rows)) if rows else 0.0,
            )
        return self._figures


class GatewayStats:
    """Windows per node; routing reads them, the pipeline feeds them when a request ends."""

    def __init__(self) -> None:
        self._nodes: dict[int, NodeWindow] = {}

    def record(
        self, node_id: int, *, ttft_ms: float | None, latency_ms: float, failed: bool
    ) -> None:
        window = self._nodes.get(node_id)
        if window is None:
            window = self._nodes[node_id] = NodeWindow()
        window.add(time.monotonic(), ttft_ms, latency_ms, failed)

    def figures(self, node_id: int) -> WindowFigures | None:
        window = self._nodes.get(node_id)
        return window.figures(time.monotonic()) if window else None
