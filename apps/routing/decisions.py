"""The decision log: routing decisions buffered in a durable stream, sampled under load.

Up to DMX_DECISION_LOG_PER_SECOND decisions a second are kept by each gateway process; above
that a proportional share is. Decisions that routed nowhere (503s) are always kept: they are
the ones an operator will come looking for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from apps.routing.router import Decision
from dmxplatform.records import JsonRecord
from dmxplatform.streams import DurableStream

DECISION_STREAM = DurableStream(("routing", "decisions"), title="Routing decisions")


@dataclass(slots=True)
class DecisionEvent(JsonRecord):
    request_id: str
    created_at: float
    requested_model: str
    model: str
    intent: str
    priority: int
    outcome: str
    chosen_node: str
    chosen_version: str
    pool: str
    fallback: bool
    candidates: list[dict]
    waited_ms: float
    decision_us: float
    # The intent's calibrated confidence and whether it was too low to route by (the alias's
    # default route was taken); last and defaulted, so entries logged before them still drain.
    intent_confidence: float | None = None
    intent_low_confidence: bool = False


class DecisionSampler:
    """A token bucket of decisions to keep: one per 1/rate seconds, with a second's burst."""

    __slots__ = ("_level", "_rate", "_stamp")

    def __init__(self, per_second: float) -> None:
        self._rate = per_second
        self._level = per_second
        self._stamp = time.monotonic()

    def keep(self) -> bool:
        now = time.monotonic()
        self._level = min(self._rate, self._level + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._level >= 1.0:
            self._level -= 1.0
            return True
        return False


def decision_event(
    decision: Decision,
    *,
    request_id: str,
    created_at: float,
    requested_model: str,
    model: str,
    intent: str,
    priority: int,
    outcome: str,
    waited_ms: float,
    intent_confidence: float | None = None,
    intent_low_confidence: bool = False,
) -> DecisionEvent:
    node = decision.node
    return DecisionEvent(
        request_id=request_id,
        created_at=created_at,
        requested_model=requested_model,
        model=model,
        intent=intent,
        priority=priority,
        outcome=outcome,
        chosen_node=node.name if node else "",
        chosen_version=node.version_tag if node else "",
        pool=decision.pool,
        fallback=decision.fallback,
        candidates=decision.trace(),
        waited_ms=round(waited_ms, 3),
        decision_us=decision.decision_us,
        intent_confidence=intent_confidence,
        intent_low_confidence=intent_low_confidence,
    )
