"""Per-intent latency in /metrics: observed once per request that ended ok, by its intent."""

import time
from types import SimpleNamespace

from apps.gateway.pipeline import _export_metrics
from apps.gateway.schemas import Endpoint
from apps.keys.gate import UsageStatus
from dmxplatform import metrics
from dmxplatform.stages import StageClock


def observed(histogram, intent: str) -> tuple[float, float]:
    """The histogram's count and sum for `intent` (its own samples: the global registry also
    runs collectors that read the database)."""
    found = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.labels.get("intent") == intent and sample.name.endswith(("_count", "_sum")):
                found[sample.name.rsplit("_", 1)[1]] = sample.value
    return found.get("count", 0.0), found.get("sum", 0.0)


def finished(intent: str, *, stream: bool, outcome=UsageStatus.OK, ttft: float = 0.2):
    """A request's state as the pipeline leaves it, received 0.5 s ago."""
    started = time.perf_counter() - 0.5
    return SimpleNamespace(
        request=SimpleNamespace(stream=stream),
        started=started,
        endpoint=Endpoint.CHAT,
        http_status=200,
        clock=StageClock(),
        node=SimpleNamespace(model="m"),
        first_token_at=started + ttft if stream else None,
        outcome=outcome,
        intent=intent,
    )


def test_a_streamed_request_counts_its_first_token_and_its_latency_under_its_intent():
    ttft, duration = (
        metrics.gateway_intent_time_to_first_token,
        metrics.gateway_intent_request_duration,
    )
    before = observed(ttft, "code"), observed(duration, "code"), observed(duration, "chat")
    _export_metrics(finished("code", stream=True, ttft=0.2))
    (ttft_count, ttft_sum), (count, total) = observed(ttft, "code"), observed(duration, "code")
    assert ttft_count == before[0][0] + 1 and abs(ttft_sum - before[0][1] - 0.2) < 1e-6
    assert count == before[1][0] + 1 and total - before[1][1] >= 0.5
    assert observed(duration, "chat") == before[2]


def test_only_requests_that_ended_ok_and_had_an_intent_are_counted():
    ttft, duration = (
        metrics.gateway_intent_time_to_first_token,
        metrics.gateway_intent_request_duration,
    )
    before = observed(ttft, "chat"), observed(duration, "chat")
    _export_metrics(finished("chat", stream=True, outcome=UsageStatus.UPSTREAM_ERROR))
    _export_metrics(finished("", stream=False))  # an embedding: no intent
    assert (observed(ttft, "chat"), observed(duration, "chat")) == before
    _export_metrics(finished("chat", stream=False))  # no first token seen: latency only
    assert observed(ttft, "chat") == before[0]
    assert observed(duration, "chat")[0] == before[1][0] + 1


def test_every_intent_is_exported_before_its_first_request():
    for histogram in (
        metrics.gateway_intent_time_to_first_token,
        metrics.gateway_intent_request_duration,
    ):
        exported = {
            sample.labels["intent"]
            for family in histogram.collect()
            for sample in family.samples
            if sample.name.endswith("_count")
        }
        assert {"code", "chat", "summarization", "translation"} <= exported
