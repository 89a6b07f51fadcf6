"""Replay Mooncake's conversation trace through a heterogeneous fleet, one routing policy at a time.

The trace (tests/routing/traces/, its README says where it comes from) gives each request's
arrival, prompt and completion lengths and the 512-token block hashes of its prompt. The fleet is
4 H100, 6 A100 and 8 L4 serving one 8B model, each node's prefill rate, decode rate and KV-cache
size computed from its hardware profile's datasheet figures (inference.hardware.profiles
.serving_rates). A node:

- admits a request when a batch slot and KV cache for its whole length are free, first come
  first served (a request that does not fit waits, as in vLLM's scheduler);
- prefills one request at a time, only the tokens its prefix cache does not hold (an LRU of
  block hashes as large as its KV cache), then decodes it in the batch at a per-sequence speed
  that falls as the batch fills (decode reads the weights once per step, plus each sequence's KV).

The arrivals are the trace's, time-compressed so that the mean rate is the asked share of the
fleet's capacity (capacity: each node's rate for the trace's mean request, without cache hits).
A request is charged its share of the node's time: the whole node while it prefills, the larger
of its batch slot and its KV share while it decodes.
"""

from __future__ import annotations

import functools
import gzip
import heapq
import itertools
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from apps.routing.breaker import BreakerBoard
from apps.routing.fleet import FleetView
from apps.routing.router import Router, RouteRequest
from apps.routing.stats import GatewayStats
from inference.hardware.profiles import profile_named, serving_rates
from tests.routing.factories import NoRedis, make_model_entry, make_snapshot

TRACE = Path(__file__).with_name("traces") / "mooncake_conversation.jsonl.gz"
BLOCK_TOKENS = 512  # the trace's block size
# Llama-3-8B: 8.0 B parameters in BF16; KV per token = 32 layers x 8 KV heads x 128 x 2 x 2 bytes.
PARAMS_BILLION = 8.0
KV_BYTES_PER_TOKEN = 131_072
MODEL_MAX_LEN = 131_072
# A full batch decodes each sequence this much slower than a single sequence.
BATCH_SLOWDOWN = 0.5
HEARTBEAT_SECONDS = 2.0
FLEET = (("nvidia-h100-sxm", 4, 64), ("nvidia-a100-sxm4-80gb", 6, 48), ("nvidia-l4", 8, 16))
POLICIES = ("round_robin", "least_loaded", "capacity_weighted", "prefix_greedy", "router")


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    arrival: float
    prompt: int
    completion: int
    blocks: tuple[int, ...]


@functools.cache
def load_trace() -> tuple[tuple[float, int, int, tuple[int, ...]], ...]:
    with gzip.open(TRACE, "rt") as lines:
        rows = [json.loads(line) for line in lines]
    return tuple(
        (r["timestamp"] / 1000, r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        for r in rows
    )


@dataclass
class SimNode:
    id: int
    profile: str
    price_per_hour: float
    prefill_rate: float
    decode_rate: float
    kv_tokens: int
    slots: int
    max_model_len: int
    active: int = 0
    kv_used: int = 0
    prefill_free: float = 0.0
    waiting: deque = field(default_factory=deque)
    cache: OrderedDict = field(default_factory=OrderedDict)
    generated: int = 0
    ttfts: deque = field(default_factory=lambda: deque(maxlen=64))

    @property
    def capacity_blocks(self) -> int:
        return self.kv_tokens // BLOCK_TOKENS

    def cached_prefix(self, blocks: tuple[int, ...]) -> int:
        """Blocks of `blocks`, from the first, this node's prefix cache holds."""
        count = 0
        for block in blocks:
            if block not in self.cache:
                break
            count += 1
        return count

    def remember(self, blocks: tuple[int, ...]) -> None:
        cache = self.cache
        for block in blocks:
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > self.capacity_blocks:
            cache.popitem(last=False)

    def fits(self, job: Job) -> bool:
        return self.active < self.slots and self.kv_used + job.prompt + job.completion <= (
            self.kv_tokens
        )

    def request_seconds(self, prompt: float, completion: float) -> float:
        """Node-seconds a request of these lengths takes at steady state (no cache hits)."""
        concurrency = min(self.slots, self.kv_tokens / (prompt + completion))
        decode = completion / (self.decode_rate * (1 - BATCH_SLOWDOWN))
        return max(prompt / self.prefill_rate, decode / concurrency)


def build_fleet() -> list[SimNode]:
    nodes = []
    ids = itertools.count(1)
    for name, count, slots in FLEET:
        profile = profile_named(name)
        rates = serving_rates(
            profile, params_billion=PARAMS_BILLION, kv_bytes_per_token=KV_BYTES_PER_TOKEN
        )
        for _ in range(count):
            nodes.append(
                SimNode(
                    id=next(ids),
                    profile=name,
                    price_per_hour=profile.hourly_price_usd,
                    prefill_rate=rates.prefill_tokens_per_second,
                    decode_rate=rates.decode_steps_per_second,
                    kv_tokens=rates.kv_cache_tokens,
                    slots=slots,
                    max_model_len=min(MODEL_MAX_LEN, rates.kv_cache_tokens),
                )
            )
    return nodes


@dataclass
class ReplayResult:
    policy: str
    load: float
    requests: int
    rejected: int
    ttft: tuple[float, float, float]  # p50, p95, p99 seconds
    e2e: tuple[float, float, float]
    cache_hit_rate: float  # prompt tokens served from a prefix cache
    cost_per_1m_tokens: float
    share_by_profile: dict[str, float]

    def as_row(self) -> str:
        t, e = self.ttft, self.e2e
        return (
            f"| {self.policy} | {self.load:.0%} | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} "
            f"| {e[0]:.1f} | {e[1]:.1f} | {e[2]:.1f} | {self.cache_hit_rate:.1%} "
            f"| {self.cost_per_1m_tokens:.3f} | {self.rejected} |"
        )


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    n = len(ordered)
    return tuple(ordered[min(n - 1, int(q * n))] for q in (0.5, 0.95, 0.99))


def replay(
    policy: str, *, load: float = 0.8, requests: int | None = None, first: int = 0
) -> ReplayResult:
    """Replay `requests` of the trace from request `first` (all by default) under `policy`."""
    trace = load_trace()
    rows = trace[first : first + requests if requests else None]
    nodes = build_fleet()
    by_id = {n.id: n for n in nodes}
    mean_prompt = sum(r[1] for r in trace) / len(trace)
    mean_completion = sum(r[2] for r in trace) / len(trace)
    capacity = sum(1 / n.request_seconds(mean_prompt, mean_completion) for n in nodes)
    span = rows[-1][0] - rows[0][0]
    # Requests per second wanted over those the trace's clock gives.
    compress = (len(rows) / span) / (load * capacity)
    jobs = [Job(i, (r[0] - rows[0][0]) * compress, r[1], r[2], r[3]) for i, r in enumerate(rows)]

    fleet = FleetView(stale_after=1e9)
    stats = GatewayStats()
    router = Router(fleet=fleet, breakers=BreakerBoard(NoRedis()), stats=stats)
    model = make_model_entry(max_context_tokens=MODEL_MAX_LEN)
    order = itertools.count()
    events: list[tuple[float, int, str, object]] = [
        (job.arrival, next(order), "arrive", job) for job in jobs
    ]
    heapq.heapify(events)
    rr = itertools.cycle(nodes)
    ttft: list[float] = []
    e2e: list[float] = []
    prompt_tokens = cached_tokens = total_tokens = 0
    spent = 0.0
    rejected = 0
    served: dict[str, int] = {}
    pending: list[Job] = []  # the admission queue: the Router found every node saturated
    next_heartbeat = 0.0
    # Per node, the tokens and decode seconds of the requests that finished since the last
    # heartbeat, and the speed they measured (an engine's inter-token latency, kept until new).
    window_decode = {n.id: [0, 0.0] for n in nodes}
    decode_speed = {n.id: 0.0 for n in nodes}
    tickets = {}  # the gateway's record of each request's work, as the Dispatcher keeps it

    def refresh(now: float) -> None:
        snapshots = {}
        for n in nodes:
            ordered = sorted(n.ttfts)
            p95 = ordered[int(0.95 * len(ordered))] * 1000 if len(ordered) >= 8 else None
            snapshots[str(n.id).encode()] = make_snapshot(
                id=n.id, name=f"sim-{n.id}", url="http://sim", max_model_len=n.max_model_len,
                num_requests_running=n.active, num_requests_waiting=len(n.waiting),
                kv_cache_usage=min(1.0, n.kv_used / n.kv_tokens), max_num_seqs=n.slots,
                profile=n.profile, gpu_count=1, hourly_price_usd=n.price_per_hour,
                ttft_p95_ms=p95,
                generation_tokens_per_second=window_decode[n.id][0] / HEARTBEAT_SECONDS,
                decode_tokens_per_second=decode_speed[n.id],
            ).encode()  # fmt: skip
            window_decode[n.id] = [0, 0.0]
        fleet.replace(snapshots)

    def start(node: SimNode, now: float, job: Job) -> None:
        nonlocal prompt_tokens, cached_tokens, spent
        node.active += 1
        node.kv_used += job.prompt + job.completion
        hit = min(node.cached_prefix(job.blocks) * BLOCK_TOKENS, job.prompt - 1)
        node.remember(job.blocks)
        prompt_tokens += job.prompt
        cached_tokens += hit
        begin = max(now, node.prefill_free)
        prefill = (job.prompt - hit) / node.prefill_rate
        first_token = node.prefill_free = begin + prefill
        speed = node.decode_rate * (1 - BATCH_SLOWDOWN * node.active / node.slots)
        decode = job.completion / speed
        share = max(1 / node.slots, (job.prompt + job.completion) / node.kv_tokens)
        spent += node.price_per_hour / 3600 * (prefill + decode * share)
        heapq.heappush(events, (first_token, next(order), "first", (node, job)))
        heapq.heappush(events, (first_token + decode, next(order), "finish", (node, job, decode)))

    def choose(job: Job, now: float) -> SimNode | str | None:
        fitting = [n for n in nodes if job.prompt + job.completion <= n.max_model_len]
        if not fitting:
            return "refuse"
        if policy == "round_robin":
            while (node := next(rr)) not in fitting:
                pass
            return node
        if policy == "least_loaded":
            return min(fitting, key=lambda n: (n.active + len(n.waiting), n.id))
        if policy == "capacity_weighted":
            return min(fitting, key=lambda n: (n.active + len(n.waiting) + 1) / n.prefill_rate)
        if policy == "prefix_greedy":
            return min(
                fitting,
                key=lambda n: (-n.cached_prefix(job.blocks), n.active + len(n.waiting), n.id),
            )
        decision = router.decide(
            RouteRequest(
                request_id=f"req_{job.index:032x}",
                model=model,
                prompt_tokens=job.prompt,
                completion_tokens=job.completion,
                prefix_blocks=job.blocks,
            )
        )
        if decision.node is not None:
            return by_id[decision.node.id]
        return None if decision.saturated else "refuse"

    def dispatch(job: Job, now: float) -> bool:
        nonlocal rejected
        node = choose(job, now)
        if node == "refuse":
            rejected += 1
            return True
        if node is None:
            return False
        tickets[job.index] = fleet.begin(
            node.id, prompt_tokens=job.prompt, completion_tokens=job.completion, blocks=job.blocks
        )
        served[node.profile] = served.get(node.profile, 0) + 1
        if not node.waiting and node.fits(job):
            start(node, now, job)
        else:
            node.waiting.append(job)
        return True

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now >= next_heartbeat:
            while now >= next_heartbeat:
                next_heartbeat += HEARTBEAT_SECONDS
            refresh(now)
            pending = [job for job in pending if not dispatch(job, now)]
        if kind == "arrive":
            if pending or not dispatch(payload, now):
                pending.append(payload)
        elif kind == "first":
            node, job = payload
            ttft.append(now - job.arrival)
            node.ttfts.append(now - job.arrival)
            fleet.prefilled(tickets[job.index])
        elif kind == "finish":
            node, job, decoded = payload
            node.active -= 1
            node.kv_used -= job.prompt + job.completion
            fleet.end(tickets.pop(job.index))
            window = window_decode[node.id]
            window[0] += job.completion
            window[1] += decoded
            if window[1] > 0:
                decode_speed[node.id] = window[0] / window[1]
            total_tokens += job.prompt + job.completion
            e2e.append(now - job.arrival)
            stats.record(node.id, ttft_ms=None, latency_ms=(now - job.arrival) * 1000, failed=False)
            while node.waiting and node.fits(node.waiting[0]):
                start(node, now, node.waiting.popleft())
        if not events and pending:
            heapq.heappush(events, (next_heartbeat, next(order), "tick", None))
    count = sum(served.values())
    return ReplayResult(
        policy=policy,
        load=load,
        requests=len(e2e),
        rejected=rejected,
        ttft=_percentiles(ttft),
        e2e=_percentiles(e2e),
        cache_hit_rate=cached_tokens / max(prompt_tokens, 1),
        cost_per_1m_tokens=spent / max(total_tokens, 1) * 1e6,
        share_by_profile={p: c / count for p, c in sorted(served.items())},
    )


def report(results: list[ReplayResult]) -> str:
    return "\n".join(
        [
            "| policy | load | TTFT p50 s | p95 s | p99 s | e2e p50 s | p95 s | p99 s "
            "| cache hits | USD per 1M tokens | refused |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *(r.as_row() for r in results),
        ]
    )


if __name__ == "__main__":
    import sys

    import django

    django.setup()
    sample = int(sys.argv[1]) if len(sys.argv) > 1 else None
    print(
        report(
            [
                replay(policy, load=load, requests=sample)
                for load in (0.6, 0.8, 0.95)
                for policy in POLICIES
            ]
        )
    )
