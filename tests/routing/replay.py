"""Replay a public production trace through a heterogeneous fleet, one routing policy at a time.

Two traces (tests/routing/traces/, its README says where each comes from): Mooncake's
conversation trace (arrival, prompt and completion lengths, 512-token prefix block hashes) and
Azure's 2023 LLM inference conversation trace (arrival, prompt and completion lengths, no
prefixes). The fleet is 4 H100, 6 A100 and 8 L4 serving one 8B model; each node is an Engine
(tests/routing/engine.py), a model of vLLM's scheduler with its own roofline step times, not the
router's rate predictions.

Requests are sent three ways: without max_tokens ("none"), all with max_tokens 2048 ("2048",
as many SDKs do; a longer answer is cut there), and with the true length as max_tokens
("true"). The router predicts each request's completion from a work table (apps.routing.work)
built, as the ledger task builds it, from the trace's requests before the replayed slice.

The arrivals are the slice's, time-compressed so that the mean rate is the asked share of the
fleet's capacity (the engines' own estimate for the trace's mean request). The gateway sees the
engines as a real one does: heartbeats every HEARTBEAT_SECONDS (running, waiting, KV-cache use,
measured prefill and decode speeds) and its own requests in flight (FleetView.begin/end).
"""

from __future__ import annotations

import csv
import functools
import gzip
import heapq
import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from apps.routing.breaker import BreakerBoard
from apps.routing.fleet import FleetView
from apps.routing.router import Router, RouteRequest, mix64
from apps.routing.stats import GatewayStats
from apps.routing.work import WorkFigures, WorkTable
from tests.routing.engine import A100, H100, L4, MODEL_MAX_LEN, Engine, Seq
from tests.routing.factories import NoRedis, make_model_entry, make_snapshot

TRACES = Path(__file__).with_name("traces")
HEARTBEAT_SECONDS = 2.0
FLEET = ((H100, 4, 64), (A100, 6, 48), (L4, 8, 16))
POLICIES = ("round_robin", "least_loaded", "capacity_weighted", "prefix_greedy", "router")
WAYS = ("none", "2048", "true")
# Every this many requests of a trace sample its mean cost (fleet_capacity).
CAPACITY_SAMPLE = 10
SDK_MAX_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class Request:
    arrival: float  # seconds from the trace's start
    prompt: int
    completion: int
    hashes: tuple[int, ...]


@functools.cache
def load_trace(name: str) -> tuple[Request, ...]:
    """The named trace: "mooncake" or "azure"."""
    if name == "mooncake":
        with gzip.open(TRACES / "mooncake_conversation.jsonl.gz", "rt") as lines:
            rows = [json.loads(line) for line in lines]
        # The trace numbers its blocks 0, 1, 2...; the gateway computes uniform 64-bit hashes
        # (inference.prefix_cache): mixed once, one to one.
        return tuple(
            Request(
                r["timestamp"] / 1000,
                r["input_length"],
                r["output_length"],
                tuple(mix64(h, 0) for h in r["hash_ids"]),
            )
            for r in rows
        )
    with gzip.open(TRACES / "azure_llm_conv_2023.csv.gz", "rt") as lines:
        rows = list(csv.DictReader(lines))
    start = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    return tuple(
        Request(
            (datetime.fromisoformat(r["TIMESTAMP"][:26]) - start).total_seconds(),
            int(r["ContextTokens"]),
            max(int(r["GeneratedTokens"]), 1),
            (),
        )
        for r in rows
    )


def _quantile(values: list[int] | list[float], q: float):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ledger_table(requests: tuple[Request, ...] | list[Request], model: str) -> WorkTable:
    """The work table the ledger task would publish after these requests (the traces carry no
    intent or key: one figure for the model)."""
    completions = [r.completion for r in requests]
    figures = WorkFigures(
        requests=len(completions),
        completion_p50=_quantile(completions, 0.5),
        completion_p95=_quantile(completions, 0.95),
    )
    return WorkTable(by_intent={(model, ""): figures})


@dataclass
class ReplayResult:
    trace: str
    way: str
    policy: str
    load: float
    requests: int
    rejected: int
    ttft: tuple[float, float, float]  # p50, p95, p99 seconds
    e2e: tuple[float, float, float]
    cache_hit_rate: float  # prompt tokens served from a prefix cache
    preemptions: int
    share_by_profile: dict[str, float]

    def as_row(self) -> str:
        t, e = self.ttft, self.e2e
        return (
            f"| {self.trace} | {self.way} | {self.policy} | {self.load:.0%} | {t[0]:.2f} "
            f"| {t[1]:.2f} | {t[2]:.2f} | {e[0]:.1f} | {e[1]:.1f} | {self.cache_hit_rate:.1%} "
            f"| {self.preemptions} | {self.rejected} |"
        )


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    return tuple(_quantile(values, q) for q in (0.5, 0.95, 0.99))  # type: ignore[return-value]


def build_fleet() -> list[Engine]:
    return [Engine(gpu, slots) for gpu, count, slots in FLEET for _ in range(count)]


@functools.cache
def fleet_capacity(trace: str) -> float:
    """Requests per second the fleet serves at full load: each engine's for the trace's mean
    cost of a request (the mean of the costs, not the cost of the mean request: attention makes
    a long prompt cost more than its share), summed."""
    requests = load_trace(trace)[::CAPACITY_SAMPLE]
    total = 0.0
    for gpu, count, slots in FLEET:
        engine = Engine(gpu, slots)
        fitting = [r for r in requests if r.prompt + 1 <= engine.max_model_len]
        mean = sum(engine.request_seconds(r.prompt, r.completion) for r in fitting) / len(fitting)
        total += count / mean
    return total


def replay(
    policy: str,
    *,
    trace: str = "mooncake",
    way: str = "none",
    load: float = 0.8,
    first: int = 0,
    requests: int | None = None,
) -> ReplayResult:
    """Replay `requests` of the trace from request `first` under `policy`, sent `way`."""
    everything = load_trace(trace)
    rows = everything[first : first + requests if requests else None]
    engines = build_fleet()
    ids = {id(e): i + 1 for i, e in enumerate(engines)}
    by_id = {i + 1: e for i, e in enumerate(engines)}
    span = rows[-1].arrival - rows[0].arrival
    # Requests per second wanted over those the trace's clock gives.
    compress = (len(rows) / span) / (load * fleet_capacity(trace))
    model = make_model_entry(max_context_tokens=MODEL_MAX_LEN)
    # The ledger: the trace's requests before the slice (the first 1,000 when it starts there).
    history = everything[:first] if first else everything[:1000]
    fleet = FleetView(stale_after=1e9)
    router = Router(
        fleet=fleet,
        breakers=BreakerBoard(NoRedis()),
        stats=GatewayStats(),
        work=ledger_table(history, model.name),
    )
    order = itertools.count()
    events: list[tuple[float, int, str, object]] = []
    for index, row in enumerate(rows):
        completion = min(row.completion, SDK_MAX_TOKENS) if way == "2048" else row.completion
        max_tokens = {"none": None, "2048": SDK_MAX_TOKENS, "true": row.completion}[way]
        seq = Seq(index, (row.arrival - rows[0].arrival) * compress, row.prompt, completion,
                  row.hashes)  # fmt: skip
        heapq.heappush(events, (seq.arrival, next(order), "arrive", (seq, max_tokens)))
    rr = itertools.cycle(engines)
    ttft: list[float] = []
    e2e: list[float] = []
    rejected = 0
    served: dict[str, int] = {}
    pending: list[tuple[Seq, int | None]] = []  # the admission queue: every node saturated
    tickets = {}
    next_heartbeat = 0.0

    def refresh() -> None:
        snapshots = {}
        for node_id, e in by_id.items():
            prefill_rate = e.prefill_tokens / e.prefill_seconds if e.prefill_seconds else 0.0
            # vLLM's inter-token latency, averaged over the window (kept when none decoded).
            if e.decode_seconds:
                e.decode_rate = e.decode_steps / e.decode_seconds
            e.decode_steps, e.decode_seconds = 0, 0.0
            snapshots[str(node_id).encode()] = make_snapshot(
                id=node_id, name=f"sim-{node_id}", url="http://sim", max_model_len=e.max_model_len,
                num_requests_running=len(e.running), num_requests_waiting=len(e.waiting),
                kv_cache_usage=max(0.0, e.kv_cache_usage), max_num_seqs=e.max_num_seqs,
                profile=e.gpu.profile, gpu_count=1, hourly_price_usd=e.gpu.price_per_hour,
                prefill_tokens_per_second=prefill_rate, decode_tokens_per_second=e.decode_rate,
            ).encode()  # fmt: skip
            e.prefill_tokens, e.prefill_seconds = 0, 0.0
        fleet.replace(snapshots)

    def kick(engine: Engine, now: float) -> None:
        """Start the engine's next step(s) when it is idle, or cut a run of decode steps short
        so that a new arrival is scheduled after the step in progress."""
        if engine.busy:
            end = engine.interrupt(now)
        else:
            seconds = engine.schedule()
            if seconds is None:
                return
            engine.busy = True
            engine.step_started = now
            end = now + seconds
        engine.version += 1
        heapq.heappush(events, (end, next(order), "step", (engine, engine.version)))

    def fits(engine: Engine, seq: Seq, max_tokens: int | None) -> bool:
        return seq.prompt + (max_tokens or 1) <= engine.max_model_len

    def outstanding(engine: Engine) -> int:
        return len(engine.running) + len(engine.waiting)

    def choose(seq: Seq, max_tokens: int | None) -> Engine | str | None:
        fitting = [e for e in engines if fits(e, seq, max_tokens)]
        if not fitting:
            return "refuse"
        if policy == "round_robin":
            while (engine := next(rr)) not in fitting:
                pass
            return engine
        if policy == "least_loaded":
            return min(fitting, key=lambda e: (outstanding(e), ids[id(e)]))
        if policy == "capacity_weighted":
            return min(fitting, key=lambda e: (outstanding(e) + 1) / e.rated_prefill())
        if policy == "prefix_greedy":
            return min(
                fitting,
                key=lambda e: (-e.cached_prefix(seq.hashes), outstanding(e), ids[id(e)]),
            )
        request = RouteRequest(
            request_id=f"req_{seq.key:032x}",
            model=model,
            prompt_tokens=seq.prompt,
            max_tokens=max_tokens,
            prefix_blocks=seq.hashes,
        )
        decision = router.decide(request)
        if decision.node is not None:
            tickets[seq.key] = fleet.begin(
                decision.node.id,
                prompt_tokens=seq.prompt,
                completion_tokens=request.decode_tokens,
                blocks=seq.hashes,
            )
            return by_id[decision.node.id]
        return None if decision.saturated else "refuse"

    def dispatch(item: tuple[Seq, int | None], now: float) -> bool:
        nonlocal rejected
        seq, max_tokens = item
        engine = choose(seq, max_tokens)
        if engine == "refuse":
            rejected += 1
            return True
        if engine is None:
            return False
        served[engine.gpu.profile] = served.get(engine.gpu.profile, 0) + 1
        engine.add(seq)
        kick(engine, now)
        return True

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now >= next_heartbeat:
            while now >= next_heartbeat:
                next_heartbeat += HEARTBEAT_SECONDS
            refresh()
            pending = [item for item in pending if not dispatch(item, now)]
        if kind == "arrive":
            if pending or not dispatch(payload, now):
                pending.append(payload)
        elif kind == "step":
            engine, version = payload
            if version != engine.version:
                continue
            engine.busy = False
            report = engine.complete(now)
            for seq in report.first_tokens:
                ttft.append(now - seq.arrival)
                if seq.key in tickets:
                    fleet.prefilled(tickets[seq.key])
            for seq in report.finished:
                e2e.append(now - seq.arrival)
                if seq.key in tickets:
                    fleet.end(tickets.pop(seq.key))
            kick(engine, now)
            if report.finished and pending:
                # A request's end wakes the admission queue (Dispatch.connect's exit).
                pending = [item for item in pending if not dispatch(item, now)]
        if not events and pending:
            heapq.heappush(events, (next_heartbeat, next(order), "tick", None))
    count = sum(served.values())
    prompt_tokens = sum(e.prompt_tokens for e in engines)
    cached = sum(e.cached_tokens for e in engines)
    return ReplayResult(
        trace=trace,
        way=way,
        policy=policy,
        load=load,
        requests=len(e2e),
        rejected=rejected,
        ttft=_percentiles(ttft),
        e2e=_percentiles(e2e),
        cache_hit_rate=cached / max(prompt_tokens, 1),
        preemptions=sum(e.preemptions for e in engines),
        share_by_profile={p: c / count for p, c in sorted(served.items())},
    )


def report(results: list[ReplayResult]) -> str:
    return "\n".join(
        [
            "| trace | max_tokens | policy | load | TTFT p50 s | p95 s | p99 s | e2e p50 s "
            "| p95 s | cache hits | preemptions | refused |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *(r.as_row() for r in results),
        ]
    )


if __name__ == "__main__":
    import sys

    import django

    django.setup()
    # The README's segments: the traces' requests after those the router was tuned on.
    segments = {"mooncake": (6000, None), "azure": (3500, None)}
    for name in sys.argv[1:] or segments:
        start, size = segments[name]
        print(
            report(
                [
                    replay(policy, trace=name, way=way, load=load, first=start, requests=size)
                    for load in (0.6, 0.8, 0.95)
                    for way in WAYS
                    for policy in POLICIES
                ]
            )
        )
