"""Read an engine's load from vLLM's Prometheus `/metrics` text.

Names as vLLM 0.12+ exports them (`vllm:kv_cache_usage_perc`; the old `gpu_*` names are gone).
Values are summed across the `engine` label, so a data-parallel server reports its total.
Latency percentiles and throughput are computed over the window between two reads, from the
histograms' and counters' deltas: what the engine did lately, not since it started. The prefill
and decode rates are measured once enough work was done for the figure to mean something, and
kept until the next one.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from inference.wire import EngineLoad

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT_BUCKETS = "vllm:time_to_first_token_seconds_bucket"
E2E_BUCKETS = "vllm:e2e_request_latency_seconds_bucket"
# Per finished request: the prompt tokens its prefill computed (cache hits excluded), and the
# seconds it spent prefilling. Their sums' deltas give the engine's prefill rate.
PREFILL_COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"
PREFILL_SECONDS = "vllm:request_prefill_time_seconds_sum"
# Prompt tokens computed before a prefill rate is taken: a few short prompts measure the
# engine's per-request overhead (12 tokens in 20 ms on the CPU), not its rate. One
# 512-token block, the unit the router predicts cache hits in.
MIN_PREFILL_TOKENS = 512
# Every gap between two of a sequence's tokens (its first token's wait excluded): their count
# over their sum is the speed one sequence decodes at, stalls behind other prompts' prefill
# chunks included. Unlike generated tokens over the window divided by the running requests, it
# does not read a window whose requests had only just started (one token each) as a slow decoder.
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
ITL_SECONDS = "vllm:inter_token_latency_seconds_sum"
# Token gaps observed before a decode rate is taken: a few measure one step's jitter.
MIN_DECODE_STEPS = 64
_LE = re.compile(r'le="([^"]+)"')

Samples = dict[str, list[tuple[str, float]]]


def parse_samples(text: str) -> Samples:
    """Return {metric name: [(label text, value), ...]} for every `vllm:` sample."""
    samples: Samples = defaultdict(list)
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        head, _, value = line.rpartition(" ")
        name, brace, labels = head.partition("{")
        try:
            samples[name].append((labels.rstrip("}") if brace else "", float(value)))
        except ValueError:
            continue
    return samples


def _total(samples: Samples, name: str) -> float:
    return sum(value for _, value in samples.get(name, ()))


def _buckets(samples: Samples, name: str) -> dict[float, float]:
    """Cumulative histogram counts by upper bound, summed across engines."""
    counts: dict[float, float] = defaultdict(float)
    for labels, value in samples.get(name, ()):
        match = _LE.search(labels)
        if match:
            counts[float(match.group(1))] += value
    return dict(counts)


def histogram_quantile(
    q: float, before: dict[float, float], after: dict[float, float]
) -> float | None:
    """The q-quantile of what a cumulative histogram gained between two reads, interpolated
    within the bucket as Prometheus's histogram_quantile does; None without new samples."""
    bounds = sorted(after)
    deltas = [(b, after[b] - before.get(b, 0.0)) for b in bounds]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in deltas:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def engine_load(text: str) -> EngineLoad:
    """Return the load fields of the node protocol from one /metrics page."""
    return EngineMonitor().observe(text, now=0.0)


@dataclass
class _Reading:
    at: float
    ttft: dict[float, float]
    e2e: dict[float, float]
    generated: float


class _MeasuredRate:
    """Work per second from two cumulative sums of an engine's (work done, seconds it took),
    taken once `minimum` work was done since the last rate and kept until the next (0.0 before
    any). Sums lower than where the window started mean the engine restarted: a new window."""

    __slots__ = ("_from", "_minimum", "rate")

    def __init__(self, minimum: float) -> None:
        self._minimum = minimum
        self._from: tuple[float, float] | None = None
        self.rate = 0.0

    def update(self, work: float, seconds: float) -> float:
        start = self._from
        if start is None or work < start[0]:
            self._from = (work, seconds)
            return self.rate
        done, took = work - start[0], seconds - start[1]
        if done >= self._minimum and took > 0:
            self.rate = round(done / took, 1)
            self._from = (work, seconds)
        return self.rate


class EngineMonitor:
    """Successive /metrics reads of one engine, turned into per-window figures."""

    def __init__(self) -> None:
        self._last: _Reading | None = None
        # Prefills that ran side by side each count their own seconds, so under load the rate
        # is what one request saw, below the engine's total: a cautious reading for a wait.
        self._prefill = _MeasuredRate(MIN_PREFILL_TOKENS)
        self._decode = _MeasuredRate(MIN_DECODE_STEPS)

    def observe(self, text: str, *, now: float) -> EngineLoad:
        samples = parse_samples(text)
        engines = max(len(samples.get(KV_CACHE, ())), 1)
        reading = _Reading(
            at=now,
            ttft=_buckets(samples, TTFT_BUCKETS),
            e2e=_buckets(samples, E2E_BUCKETS),
            generated=_total(samples, GENERATION_TOKENS),
        )
        load = EngineLoad(
            num_requests_running=int(_total(samples, RUNNING)),
            num_requests_waiting=int(_total(samples, WAITING)),
            # Usage is a fraction per engine; the node's is their mean.
            kv_cache_usage=min(max(_total(samples, KV_CACHE) / engines, 0.0), 1.0),
            prefix_cache_queries=_total(samples, PREFIX_QUERIES),
            prefix_cache_hits=_total(samples, PREFIX_HITS),
        )
        load.prefill_tokens_per_second = self._prefill.update(
            _total(samples, PREFILL_COMPUTED), _total(samples, PREFILL_SECONDS)
        )
        load.decode_tokens_per_second = self._decode.update(
            _total(samples, ITL_COUNT), _total(samples, ITL_SECONDS)
        )
        previous, self._last = self._last, reading
        if previous is None or now <= previous.at:
            return load
        ttft = histogram_quantile(0.95, previous.ttft, reading.ttft)
        e2e = histogram_quantile(0.95, previous.e2e, reading.e2e)
        load.ttft_p95_ms = None if ttft is None else round(ttft * 1000, 2)
        load.e2e_p95_ms = None if e2e is None else round(e2e * 1000, 2)
        generated = max(reading.generated - previous.generated, 0.0)
        load.generation_tokens_per_second = round(generated / (now - previous.at), 2)
        return load
