"""The stages of one request through the gateway, and the clock that times them.

Each request's usage record carries its stage timings (milliseconds, in the order below), and
`dmx_gateway_stage_seconds` counts the stages the gateway and routing add (GATEWAY_STAGES; the
engine's time is in the time-to-first-token and stream-duration histograms). Together they
answer the first question of a slow request: was it the gateway, routing, or the engine?
"""

from __future__ import annotations

import time
from enum import StrEnum


class Stage(StrEnum):
    AUTH = "auth"
    PARSE = "parse"
    INTENT = "intent"
    SCREEN = "screen"
    CONTEXT = "context"
    LIMITS = "limits"
    QUEUE = "queue"
    ROUTE = "route"
    CONNECT = "connect"
    TTFT = "ttft"
    DECODE = "decode"
    GENERATE = "generate"
    SETTLE = "settle"


# Who answers for each stage: the first three layers of a diagnosis.
LAYER_OF_STAGE = {
    Stage.AUTH: "gateway",
    Stage.PARSE: "gateway",
    Stage.INTENT: "gateway",
    Stage.SCREEN: "gateway",
    Stage.CONTEXT: "gateway",
    Stage.LIMITS: "gateway",
    Stage.QUEUE: "routing",
    Stage.ROUTE: "routing",
    Stage.CONNECT: "inference",
    Stage.TTFT: "inference",
    Stage.DECODE: "inference",
    Stage.GENERATE: "inference",
    Stage.SETTLE: "gateway",
}

STAGE_HELP = {
    Stage.AUTH: "the key looked up and checked (signature, networks, expiry)",
    Stage.PARSE: "the body parsed and validated",
    Stage.INTENT: "the prompt classified",
    Stage.SCREEN: "the model resolved and the prompt screened for sensitive terms",
    Stage.CONTEXT: "the prompt's tokens counted against the context allowed",
    Stage.LIMITS: "the key's rate limits and quotas reserved",
    Stage.QUEUE: "waiting in the priority queue for a node with room",
    Stage.ROUTE: "the routing decision (and any half-open breaker probe)",
    Stage.CONNECT: "sending to the node until its response began (a failed try included)",
    Stage.TTFT: "from the response's start to its first token (streamed)",
    Stage.DECODE: "from the first token to the end of the stream (streamed)",
    Stage.GENERATE: "the whole completion, read in one piece (not streamed)",
    Stage.SETTLE: "the response filtered and its usage taken, before the record is sent",
}

# The stages the gateway and routing add, as opposed to the engine's: the histogram's stages.
GATEWAY_STAGES = frozenset(
    stage for stage, layer in LAYER_OF_STAGE.items() if layer in ("gateway", "routing")
)


class StageClock:
    """Times consecutive stages: each mark closes the stage that ran since the last one.

    A stage marked twice (a second routing decision after a wait in the queue, a second
    connection after a failed one) adds up."""

    __slots__ = ("_last", "started", "timings")

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def mark(self, stage: Stage) -> float:
        now = time.perf_counter()
        name = stage.value  # a plain str: orjson writes no other kind of key
        self.timings[name] = round(self.timings.get(name, 0.0) + (now - self._last) * 1000, 3)
        self._last = now
        return now


class TracedStageClock(StageClock):
    """A StageClock that also keeps each stage's start and end (perf_counter seconds), for its
    span: only for a request being traced, so an untraced one's clock does no more than before."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[str, float, float]] = []

    def mark(self, stage: Stage) -> float:
        start = self._last
        now = super().mark(stage)
        self.spans.append((stage.value, start, now))
        return now
