"""Read an engine's load from vLLM's Prometheus `/metrics` text.

Names as vLLM 0.12+ exports them (`vllm:kv_cache_usage_perc`; the old `gpu_*` names are gone).
Values are summed across the `engine` label, so a data-parallel server reports its total.
"""

from __future__ import annotations

from collections import defaultdict

from inference.wire import EngineLoad

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


def parse_samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """Return {metric name: [(label text, value), ...]} for every `vllm:` sample."""
    samples: dict[str, list[tuple[str, float]]] = defaultdict(list)
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


def _total(samples: dict[str, list[tuple[str, float]]], name: str) -> float:
    return sum(value for _, value in samples.get(name, ()))


def engine_load(text: str) -> EngineLoad:
    """Return the load fields of the node protocol from a /metrics page."""
    samples = parse_samples(text)
    engines = max(len(samples.get(KV_CACHE, ())), 1)
    return EngineLoad(
        num_requests_running=int(_total(samples, RUNNING)),
        num_requests_waiting=int(_total(samples, WAITING)),
        # Usage is a fraction per engine; the node's is their mean.
        kv_cache_usage=min(max(_total(samples, KV_CACHE) / engines, 0.0), 1.0),
        prefix_cache_queries=_total(samples, PREFIX_QUERIES),
        prefix_cache_hits=_total(samples, PREFIX_HITS),
    )
