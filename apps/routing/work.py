"""What a request will likely generate, from what requests like it generated: per model and
intent (and per key with enough history), the ledger's completion tokens, first-token times
and latencies, recomputed by a task and published with the routing table.

The router predicts a request's decode work from them (`WorkTable.predict`): a dict lookup or
three per request. Billing does not: it reserves the worst case, `max_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A key's own figures are used from this many of its requests on: fewer say more about chance
# than about the key.
KEY_MIN_REQUESTS = 50
# A model and intent's figures, likewise.
INTENT_MIN_REQUESTS = 20
# The prediction with no history at all: about the median answer of public chat traces (Azure's
# 2023 conversation trace: 129 tokens; ShareGPT's: about 200), rounded up. Not max_tokens: a
# client's cap says how long an answer may be, not how long it will be.
DEFAULT_COMPLETION_TOKENS = 256


@dataclass(frozen=True, slots=True)
class WorkFigures:
    """One group's figures over the ledger's window."""

    requests: int
    completion_p50: int
    completion_p95: int
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None


@dataclass(frozen=True, slots=True)
class WorkTable:
    """The figures by (model, intent) and (model, intent, key id); intent "" is the model's
    requests of every intent."""

    by_intent: dict[tuple[str, str], WorkFigures] = field(default_factory=dict)
    by_key: dict[tuple[str, str, int], WorkFigures] = field(default_factory=dict)

    def figures(self, model: str, intent: str, key_id: int | None) -> WorkFigures | None:
        """The most specific figures with enough history: the key's for this intent, the
        intent's, then the model's."""
        if key_id is not None and self.by_key:
            found = self.by_key.get((model, intent, key_id))
            if found is not None:
                return found
        return self.by_intent.get((model, intent)) or self.by_intent.get((model, ""))

    def predict(
        self, model: str, intent: str = "", key_id: int | None = None, max_tokens: int | None = None
    ) -> int:
        """Tokens the request will likely generate: its group's median, capped by its
        max_tokens (DEFAULT_COMPLETION_TOKENS without history)."""
        found = self.figures(model, intent, key_id)
        predicted = found.completion_p50 if found is not None else DEFAULT_COMPLETION_TOKENS
        if max_tokens:
            predicted = min(predicted, max_tokens)
        return max(predicted, 1)
