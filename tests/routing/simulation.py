"""A discrete-event simulation of a mixed GPU fleet, to compare the router with round-robin.

No GPU is needed: each simulated node serves requests with the speed, concurrency and price of
its hardware class, slows down as its batch grows (decode is memory-bandwidth-bound), and a few
nodes are degraded (thermal throttling, a noisy neighbour on the memory bus). The real Router
decides, reading node snapshots refreshed every heartbeat interval, this gateway's in-flight
counts and its latency windows, exactly as in the gateway; round-robin ignores all of it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from apps.hardware.nodestate import NodeSnapshot
from apps.routing.breaker import BreakerBoard
from apps.routing.fleet import FleetView
from apps.routing.router import Router, RouteRequest
from apps.routing.stats import GatewayStats
from tests.routing.factories import NoRedis, make_model_entry, make_snapshot


@dataclass(frozen=True)
class Hardware:
    profile: str
    price_per_hour: float
    tokens_per_second: float  # one sequence's decode speed on an idle node
    prefill_tokens_per_second: float
    slots: int  # sequences decoded together before requests queue


# Roughly proportional to memory bandwidth (decode) and compute (prefill) of each class.
H100 = Hardware("nvidia-h100-sxm", 4.0, 90.0, 12_000.0, 32)
A100 = Hardware("nvidia-a100-sxm4-80gb", 2.5, 60.0, 6_000.0, 24)
L4 = Hardware("nvidia-l4", 0.8, 25.0, 1_500.0, 8)
# A batch at its slot limit decodes this much slower per sequence than one sequence alone.
BATCH_SLOWDOWN = 0.5
HEARTBEAT_SECONDS = 2.0


@dataclass
class SimNode:
    id: int
    hardware: Hardware
    degraded: float = 1.0  # speed multiplier: below 1 for throttled or contended nodes
    temperature_c: float = 60.0
    bandwidth: float = 0.4
    active: int = 0
    waiting: deque = field(default_factory=deque)
    generated: int = 0
    busy_seconds: float = 0.0
    latencies: deque = field(default_factory=lambda: deque(maxlen=200))

    def decode_speed(self) -> float:
        """Tokens per second one sequence decodes at now."""
        load = min(self.active, self.hardware.slots) / self.hardware.slots
        return self.hardware.tokens_per_second * self.degraded * (1 - BATCH_SLOWDOWN * load)

    def service_seconds(self, prompt: int, completion: int) -> float:
        return prompt / self.hardware.prefill_tokens_per_second + completion / self.decode_speed()

    def snapshot(self, now: float) -> NodeSnapshot:
        ordered = sorted(self.latencies)
        p95 = ordered[int(0.95 * len(ordered))] * 1000 if len(ordered) >= 8 else None
        return make_snapshot(
            id=self.id, name=f"sim-{self.id}", url="http://sim", max_model_len=8192,
            num_requests_running=self.active, num_requests_waiting=len(self.waiting),
            kv_cache_usage=min(0.95, self.active / self.hardware.slots * 0.8),
            profile=self.hardware.profile, gpu_count=1,
            memory_bandwidth_utilization=self.bandwidth, temperature_c=self.temperature_c,
            hourly_price_usd=self.hardware.price_per_hour, e2e_p95_ms=p95,
            generation_tokens_per_second=self.generated / max(now, 1.0),
            decode_tokens_per_second=self.decode_speed(),
        )  # fmt: skip


def build_fleet(seed: int = 7) -> list[SimNode]:
    """Three dozen nodes of three classes; one in six is degraded."""
    rng = random.Random(seed)
    nodes = []
    ids = itertools.count(1)
    for hardware, count in ((H100, 10), (A100, 12), (L4, 14)):
        for _ in range(count):
            node = SimNode(id=next(ids), hardware=hardware)
            if rng.random() < 1 / 6:
                node.degraded = 0.35
                node.temperature_c = 82.0 if rng.random() < 0.5 else 65.0
                node.bandwidth = 0.93
            nodes.append(node)
    return nodes


@dataclass
class Result:
    policy: str
    requests: int
    p50_s: float
    p95_s: float
    cost_per_1k_tokens: float

    def as_row(self) -> str:
        return (
            f"| {self.policy} | {self.requests} | {self.p50_s:.2f} | {self.p95_s:.2f} "
            f"| {self.cost_per_1k_tokens * 1000:.3f} |"
        )


def capacity_tokens_per_second(nodes: list[SimNode]) -> float:
    return sum(
        n.hardware.slots * n.hardware.tokens_per_second * n.degraded * (1 - BATCH_SLOWDOWN)
        for n in nodes
    )


def simulate(policy: str, *, requests: int = 4000, load: float = 0.7, seed: int = 11) -> Result:
    """Run one policy ("router" or "round_robin") over the same arrivals."""
    rng = random.Random(seed)
    nodes = build_fleet()
    by_id = {n.id: n for n in nodes}
    mean_completion = 200
    rate = load * capacity_tokens_per_second(nodes) / mean_completion  # requests per second
    fleet = FleetView(stale_after=1e9)
    router = Router(fleet=fleet, breakers=BreakerBoard(NoRedis()), stats=GatewayStats())
    model = make_model_entry(max_context_tokens=8192)
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    t = 0.0
    for i in range(requests):
        t += rng.expovariate(rate)
        prompt = int(rng.lognormvariate(6.0, 0.8))  # ~400 tokens, long tail
        completion = max(8, int(rng.lognormvariate(5.0, 0.7)))  # ~150 tokens, long tail
        heapq.heappush(events, (t, next(order), "arrive", (i, prompt, completion)))
    next_heartbeat = 0.0
    round_robin = itertools.cycle(nodes)
    latencies: list[float] = []
    spent = 0.0
    tokens = 0

    def start(node: SimNode, now: float, job) -> None:
        arrived, prompt, completion, ticket = job
        # Its prompt is the engine's as soon as it runs; the model has no first-token event.
        fleet.prefilled(ticket)
        node.active += 1
        duration = node.service_seconds(prompt, completion)
        heapq.heappush(
            events, (now + duration, next(order), "finish", (node.id, arrived, job, duration))
        )

    while events:
        now, _, kind, payload = heapq.heappop(events)
        while now >= next_heartbeat:
            fleet.replace({str(n.id).encode(): n.snapshot(next_heartbeat).encode() for n in nodes})
            next_heartbeat += HEARTBEAT_SECONDS
        if kind == "arrive":
            _, prompt, completion = payload
            if policy == "router":
                decision = router.decide(
                    RouteRequest(
                        request_id=f"req_{rng.getrandbits(128):032x}",
                        model=model,
                        prompt_tokens=prompt,
                        completion_tokens=completion,
                    )
                )
                node = (
                    by_id[decision.node.id]
                    if decision.node
                    else min(nodes, key=lambda n: len(n.waiting))
                )
            else:
                node = next(round_robin)
            # Recorded as the dispatcher records a request it sent (FleetView.begin/end).
            ticket = fleet.begin(node.id, prompt_tokens=prompt, completion_tokens=completion)
            job = (now, prompt, completion, ticket)
            if node.active < node.hardware.slots:
                start(node, now, job)
            else:
                node.waiting.append(job)
        else:
            node_id, arrived, job, duration = payload
            node = by_id[node_id]
            node.active -= 1
            _, prompt, completion, ticket = job
            fleet.end(ticket)
            latency = now - arrived
            latencies.append(latency)
            node.latencies.append(latency)
            node.generated += completion
            router.stats.record(node_id, ttft_ms=None, latency_ms=latency * 1000, failed=False)
            # The node's time this request used: its share of the batch it ran in.
            share = duration / max(node.hardware.slots, 1)
            spent += node.hardware.price_per_hour / 3600 * share
            tokens += prompt + completion
            if node.waiting:
                start(node, now, node.waiting.popleft())
    latencies.sort()
    return Result(
        policy=policy,
        requests=len(latencies),
        p50_s=latencies[len(latencies) // 2],
        p95_s=latencies[int(0.95 * len(latencies))],
        cost_per_1k_tokens=spent / (tokens / 1000),
    )


def report(results: list[Result]) -> str:
    return "\n".join(
        [
            "| policy | requests | p50 s | p95 s | cost per 1M tokens, USD |",
            "|---|---:|---:|---:|---:|",
            *(r.as_row() for r in results),
        ]
    )
