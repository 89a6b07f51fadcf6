"""The routing decision alone, and the router against round-robin on a simulated fleet.

    .venv/bin/python bench/routing.py

Part 1 times Router.decide over 50 live nodes (mixed load, temperatures, prices; a canary
version; prefix block hashes; this gateway's queued work; completions predicted from a work
table by intent and key) with time.perf_counter_ns, after a
warm-up, and prints p50/p99/max.
Part 2 runs tests/routing/simulation.py for both policies and prints the table the README keeps.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")
os.environ.setdefault("DMX_DEBUG", "1")

DECISIONS = 20_000
NODES = 50


def decision_benchmark() -> dict[str, float]:
    from apps.models.catalog import VersionEntry
    from apps.routing.work import WorkFigures, WorkTable
    from tests.routing.factories import make_model_entry, make_router, make_snapshot, route_request

    rng = random.Random(3)
    versions = {
        1: VersionEntry(id=1, tag="v1", is_stable=True, canary_percent=0.0),
        2: VersionEntry(id=2, tag="v2", is_stable=False, canary_percent=5.0),
    }
    model = make_model_entry(versions=versions, sla_latency_p95_ms=2000)
    nodes = [
        make_snapshot(
            version_id=1 if i % 10 else 2,
            version_tag="v1" if i % 10 else "v2",
            num_requests_running=rng.randint(0, 20),
            num_requests_waiting=rng.randint(0, 6),
            kv_cache_usage=rng.random() * 0.9,
            memory_bandwidth_utilization=rng.random(),
            temperature_c=rng.uniform(50, 84),
            hourly_price_usd=rng.choice([0.8, 2.5, 4.0]),
            generation_tokens_per_second=rng.uniform(200, 3000),
            decode_tokens_per_second=rng.uniform(15, 120),
            e2e_p95_ms=rng.uniform(300, 4000),
            profile=rng.choice(["nvidia-h100-sxm", "nvidia-a100-sxm4-80gb", "nvidia-l4"]),
            gpu_count=1,
            max_num_seqs=32,
            # Every prompt below fits: a decision that refuses all for context measures nothing.
            max_model_len=131_072,
        )
        for i in range(NODES)
    ]
    router = make_router(*nodes)
    router.fleet.stale_after = 1e9  # the snapshots are made once; nothing refreshes them here
    # Predicted completions (apps.routing.work) per intent and for 500 keys with history.
    intents = ("chat", "code", "summarization", "translation", "")
    router.work = WorkTable(
        by_intent={
            (model.name, intent): WorkFigures(1000, rng.randint(50, 800), 2000)
            for intent in intents
        },
        by_key={
            (model.name, rng.choice(intents), key): WorkFigures(100, rng.randint(50, 800), 2000)
            for key in range(500)
        },
    )

    def blocks() -> tuple[int, ...]:
        # A shared first block (a system prompt), then the conversation's own: up to 64 blocks.
        return (1, *(rng.getrandbits(64) for _ in range(rng.randint(0, 63))))

    # Work this gateway has on the nodes, and the prefix index it built from it.
    for node in nodes:
        for _ in range(rng.randint(0, 8)):
            router.fleet.begin(
                node.id,
                prompt_tokens=rng.randint(100, 30_000),
                completion_tokens=rng.randint(10, 1000),
                blocks=blocks(),
            )
    requests = [
        route_request(
            model,
            request_id=f"req_{rng.getrandbits(128):032x}",
            affinity=rng.getrandbits(64),
            prompt_tokens=rng.randint(100, 30_000),
            prefix_blocks=blocks(),
            completion_tokens=None,  # predicted by the router
            max_tokens=rng.choice((None, 2048, 256)),
            intent=rng.choice(intents),
            key_id=rng.randint(0, 999),
        )
        for _ in range(DECISIONS)
    ]
    for request in requests[:1000]:
        router.decide(request)
        request.completion_tokens = None  # predicted again when timed
    samples = []
    for request in requests:
        started = time.perf_counter_ns()
        router.decide(request)
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(0.99 * len(samples))] / 1000,
        "max_us": samples[-1] / 1000,
    }


def main() -> None:
    import django

    django.setup()
    from tests.routing.simulation import report, simulate

    figures = decision_benchmark()
    print(f"Routing decision over {NODES} nodes, {DECISIONS} decisions:")
    print("| p50 µs | p99 µs | max µs |\n|---:|---:|---:|")
    print(f"| {figures['p50_us']:.0f} | {figures['p99_us']:.0f} | {figures['max_us']:.0f} |\n")
    print(
        "Simulated fleet: 36 nodes (10 H100, 12 A100, 14 L4; one in six degraded), "
        "4,000 requests at 70% of capacity:"
    )
    print(report([simulate("router"), simulate("round_robin")]))


if __name__ == "__main__":
    main()
