"""SLO judgement and the scaling decision, as pure functions of measured figures and a policy.

A model breaches when the P95 latency of its recent requests is over its target, or when its
live nodes have more requests waiting than the policy's target per node. It is calm only when
it is well under both. Scaling out needs `breaches_to_scale_out` breaching evaluations in a row,
scaling in `calm_to_scale_in` calm ones, and neither happens within `cooldown_seconds` of the
last change: the gap between "breach" and "calm" and the counts are the hysteresis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from apps.routing.choices import ScalingAction
from apps.routing.models import ScalingPolicy

# The latency window, as the SLO is written: P95 over five minutes.
SLO_WINDOW = timedelta(minutes=5)
# Fewer successful requests than this in the window cannot show a P95 (with 19 it is simply the
# slowest one): the latency is not judged and the queue decides alone.
MIN_LATENCY_SAMPLES = 20
# Calm means latency under half its target. Taking one replica away from N raises each
# survivor's load by N/(N-1), twice at N=2, and latency under load rises faster than load;
# at half the target a model can lose a replica without breaching straight after.
CALM_LATENCY_FRACTION = 0.5
# ... and fewer than a quarter of the target's waiting requests per node. The queue of a
# saturated engine grows faster than its latency, so it gets the wider margin.
CALM_QUEUE_FRACTION = 0.25


class Verdict(StrEnum):
    BREACH = "breach"
    CALM = "calm"
    STEADY = "steady"  # neither: inside the hysteresis band, or nothing to judge by


@dataclass(frozen=True)
class Figures:
    """What one evaluation measured, with the targets it measured against."""

    window_start: datetime
    window_end: datetime
    latency_p95_ms: float | None
    latency_samples: int
    latency_target_ms: int | None
    ttft_p95_ms: float | None
    ttft_samples: int
    ttft_target_ms: int | None
    live_nodes: int
    waiting: int
    queue_target: float

    @property
    def queue_per_node(self) -> float | None:
        return self.waiting / self.live_nodes if self.live_nodes else None

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        data["window_start"] = self.window_start.isoformat()
        data["window_end"] = self.window_end.isoformat()
        data["queue_per_node"] = self.queue_per_node
        return data


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)


def _latency_checks(figures: Figures) -> list[tuple[str, float, int]]:
    """The latency figures there is a target and enough samples for: (name, p95, target)."""
    checks = []
    if (
        figures.latency_target_ms
        and figures.latency_p95_ms is not None
        and figures.latency_samples >= MIN_LATENCY_SAMPLES
    ):
        checks.append(("P95 latency", figures.latency_p95_ms, figures.latency_target_ms))
    if (
        figures.ttft_target_ms
        and figures.ttft_p95_ms is not None
        and figures.ttft_samples >= MIN_LATENCY_SAMPLES
    ):
        checks.append(("P95 time to first token", figures.ttft_p95_ms, figures.ttft_target_ms))
    return checks


def judge(figures: Figures, *, alert: str | None = None) -> Judgement:
    """Say whether the figures breach the SLO, are calm, or neither; a firing alert breaches."""
    breaches = [f"alert {alert} firing"] if alert else []
    latency = _latency_checks(figures)
    for name, value, target in latency:
        if value > target:
            breaches.append(f"{name} {value:.0f} ms > {target} ms")
    queue = figures.queue_per_node
    if queue is not None and queue > figures.queue_target:
        breaches.append(f"{queue:.1f} waiting per node > {figures.queue_target:g}")
    if breaches:
        return Judgement(Verdict.BREACH, breaches)
    # No live node: nothing says the model could do with less.
    if queue is None:
        return Judgement(Verdict.STEADY, ["no live node to judge the queue by"])
    calm = queue < CALM_QUEUE_FRACTION * figures.queue_target and all(
        value < CALM_LATENCY_FRACTION * target for _, value, target in latency
    )
    if calm:
        return Judgement(Verdict.CALM, ["well under the SLO and the queue target"])
    return Judgement(Verdict.STEADY, ["within the SLO, not far enough under it to scale in"])


@dataclass(frozen=True)
class Decision:
    action: ScalingAction
    to_replicas: int
    consecutive_breaches: int
    consecutive_calm: int
    reason: str
    record: bool  # worth a ScalingEvent: a change, or holding while breaching


def cooldown_left(policy: ScalingPolicy, *, now: datetime) -> float:
    """Seconds until the policy may scale again; 0 when it may now."""
    if policy.last_scaled_at is None:
        return 0.0
    left = policy.cooldown_seconds - (now - policy.last_scaled_at).total_seconds()
    return max(left, 0.0)


def decide(
    policy: ScalingPolicy,
    *,
    judgement: Judgement,
    current: int,
    now: datetime,
    alert: bool = False,
) -> Decision:
    """Decide what to do from the policy's bounds and carried counts; change nothing.

    A firing alert counts as enough breaches at once: Alertmanager rules wait out their own
    `for:` duration before they fire, so the alert is already a sustained breach. The cooldown
    and max_replicas still hold.
    """
    why = "; ".join(judgement.reasons)
    if current < policy.min_replicas:
        return Decision(
            ScalingAction.SCALE_OUT, policy.min_replicas, 0, 0, "below min_replicas", True
        )
    if current > policy.max_replicas:
        return Decision(
            ScalingAction.SCALE_IN, policy.max_replicas, 0, 0, "above max_replicas", True
        )
    if judgement.verdict is Verdict.BREACH:
        needed = policy.breaches_to_scale_out
        breaches = needed if alert else min(policy.consecutive_breaches + 1, needed)
        wait = cooldown_left(policy, now=now)
        if breaches < needed:
            held = f"{why} (breach {breaches} of {needed})"
        elif current >= policy.max_replicas:
            held = f"{why}; at max_replicas"
        elif wait:
            held = f"{why}; cooling down, {wait:.0f} s left"
        else:
            return Decision(ScalingAction.SCALE_OUT, current + 1, 0, 0, why, True)
        return _hold(current, breaches, 0, held, record=True)
    if judgement.verdict is Verdict.CALM:
        needed = policy.calm_to_scale_in
        calm = min(policy.consecutive_calm + 1, needed)
        if calm < needed or current <= policy.min_replicas or cooldown_left(policy, now=now):
            return _hold(current, 0, calm, why, record=False)
        return Decision(
            ScalingAction.SCALE_IN, current - 1, 0, 0, f"{why} ({calm} calm in a row)", True
        )
    return _hold(current, 0, 0, why, record=False)


def _hold(current: int, breaches: int, calm: int, reason: str, *, record: bool) -> Decision:
    return Decision(ScalingAction.HOLD, current, breaches, calm, reason, record)
