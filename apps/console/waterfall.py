"""A request's stage timings as a waterfall: each stage after the one before, in pipeline order.

The usage record keeps its timings as JSON, whose key order PostgreSQL does not keep; the order
comes from dmxplatform.stages.Stage, which lists the stages as the pipeline runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dmxplatform.stages import LAYER_OF_STAGE, STAGE_HELP, Stage

# A stage the gateway no longer has (a record written by an older release): still shown, after
# the known ones, so that its time is not taken for unaccounted.
OTHER_LAYER = "other"
KNOWN_STAGES = frozenset(stage.value for stage in Stage)


@dataclass(frozen=True, slots=True)
class Bar:
    """One stage: where it starts and how long it ran (ms), as a share of the whole (%)."""

    name: str
    layer: str
    help: str
    ms: float
    offset_ms: float
    left_pct: float
    width_pct: float
    slowest: bool = False


@dataclass(frozen=True, slots=True)
class Waterfall:
    bars: list[Bar]
    duration_ms: float  # the request's own, from its usage record
    accounted_ms: float  # the sum of its stages
    # The request's time no stage holds (before the first mark, after the last): shown so that
    # a slow request whose stages look fast does not hide where its time went.
    unaccounted: Bar | None

    @property
    def slowest(self) -> Bar | None:
        return next((bar for bar in self.bars if bar.slowest), None)


def _ordered(timings: Mapping[str, float]) -> list[tuple[str, str, str, float]]:
    known = [
        (stage.value, LAYER_OF_STAGE[stage], STAGE_HELP[stage], float(timings[stage.value]))
        for stage in Stage
        if stage.value in timings
    ]
    others = [
        (name, OTHER_LAYER, "", float(ms))
        for name, ms in timings.items()
        if name not in KNOWN_STAGES
    ]
    return known + others


def waterfall(*, timings: Mapping[str, float], duration_ms: float) -> Waterfall:
    """Lay a request's stages end to end and mark the slowest."""
    stages = _ordered(timings or {})
    accounted = sum(ms for *_, ms in stages)
    gap = max(duration_ms - accounted, 0.0)
    scale = max(duration_ms, accounted) or 1.0
    slowest = max(range(len(stages)), key=lambda i: stages[i][3], default=None)
    bars, offset = [], 0.0
    for i, (name, layer, help_text, ms) in enumerate(stages):
        bars.append(
            Bar(
                name=name,
                layer=layer,
                help=help_text,
                ms=ms,
                offset_ms=offset,
                left_pct=offset / scale * 100,
                width_pct=ms / scale * 100,
                slowest=i == slowest,
            )
        )
        offset += ms
    unaccounted = None
    if gap > 0:
        unaccounted = Bar(
            name="unaccounted",
            layer="unaccounted",
            help="the request's duration that no stage holds",
            ms=gap,
            offset_ms=offset,
            left_pct=offset / scale * 100,
            width_pct=gap / scale * 100,
        )
    return Waterfall(
        bars=bars, duration_ms=duration_ms, accounted_ms=accounted, unaccounted=unaccounted
    )
