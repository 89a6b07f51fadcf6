"""Which node serves a request: filters, then weighted scorers, then a pick; every step named.

A decision reads only memory (the fleet view, breakers and windows refreshed in the background)
and takes a few microseconds per node. The filters and scorers are plain functions, listed in
FILTERS and SCORERS, each in 0..1 and weighted by DMX_ROUTE_SCORE_WEIGHTS:

filters  live (up, heartbeat fresh), breaker (not open), version (the canary split), context
         (prompt plus completion fit the node), kv_cache (headroom left), temperature (below the
         drain threshold), saturated (engine queue plus this gateway's in-flight below a cap)
scorers  queue, kv_cache, bandwidth (memory-bandwidth pressure), temperature (derating),
         latency (P95 against the model's SLA), cost (per 1K tokens), affinity (the node a prompt
         prefix hashes to, while it is not overloaded), hardware (the routing table's preference)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from django.conf import settings

from apps.hardware.fleet import NodeSnapshot
from apps.models.catalog import ModelEntry
from apps.routing.breaker import BreakerBoard, BreakerState
from apps.routing.fleet import FleetView
from apps.routing.stats import GatewayStats

# The request count at which the queue score halves: a few requests per node already batch well.
QUEUE_HALF_SCORE = 4.0
_MASK64 = (1 << 64) - 1
SATURATED = "saturated"


@dataclass(slots=True)
class RouteRequest:
    request_id: str
    model: ModelEntry
    prompt_tokens: int
    completion_tokens: int
    priority: int = 1
    affinity: int | None = None
    preferred_profiles: frozenset[str] = frozenset()


@dataclass(slots=True)
class Verdict:
    node: NodeSnapshot
    rejected_by: str | None = None
    scores: dict[str, float] | None = None
    total: float = 0.0


@dataclass(slots=True)
class Decision:
    node: NodeSnapshot | None
    pool: str
    verdicts: list[Verdict]
    fallback: bool = False
    decision_us: float = 0.0

    @property
    def saturated(self) -> bool:
        """No node chosen, and saturation was the only reason some node was refused."""
        if self.node is not None:
            return False
        reasons = {v.rejected_by for v in self.verdicts}
        return SATURATED in reasons and reasons <= {SATURATED, "version", "live", "breaker"}

    def trace(self) -> list[dict]:
        """The decision as the log keeps it: each candidate's verdict and scores."""
        return [
            {
                "node": v.node.name,
                "version": v.node.version_tag,
                "rejected_by": v.rejected_by,
                "scores": {k: round(s, 4) for k, s in (v.scores or {}).items()},
                "total": round(v.total, 4),
            }
            for v in self.verdicts
        ]


@dataclass(slots=True)
class _Context:
    request: RouteRequest
    fleet: FleetView
    breakers: BreakerBoard
    stats: GatewayStats
    now: float
    versions: frozenset[int]
    affinity_node: int | None = None
    best_latency: float | None = None
    best_cost: float | None = None
    latency: dict[int, float | None] = field(default_factory=dict)
    cost: dict[int, float | None] = field(default_factory=dict)


# Filters: None lets the node through; a string says why not. -----------------------------------


def _live(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.is_live(now=ctx.now, stale_after=ctx.fleet.stale_after)


def _breaker(ctx: _Context, node: NodeSnapshot) -> bool:
    return ctx.breakers.state(node.id, ctx.now) != BreakerState.OPEN


def _version(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.version_id in ctx.versions


def _context(ctx: _Context, node: NodeSnapshot) -> bool:
    request = ctx.request
    return request.prompt_tokens + request.completion_tokens <= node.max_model_len


def _kv_headroom(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.kv_cache_usage < settings.DMX_ROUTE_KV_CACHE_LIMIT


def _cool_enough(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.temperature_c < settings.DMX_ROUTE_DRAIN_TEMPERATURE_C


def _not_saturated(ctx: _Context, node: NodeSnapshot) -> bool:
    queued = node.num_requests_waiting + ctx.fleet.inflight[node.id]
    return queued < settings.DMX_ROUTE_SATURATION_QUEUE


FILTERS: tuple[tuple[str, Callable[[_Context, NodeSnapshot], bool]], ...] = (
    ("live", _live),
    ("breaker", _breaker),
    ("version", _version),
    ("context", _context),
    ("kv_cache", _kv_headroom),
    ("temperature", _cool_enough),
    (SATURATED, _not_saturated),
)


# Scorers: 0 (worst) to 1 (best). -------------------------------------------------------------


def _queue_score(ctx: _Context, node: NodeSnapshot) -> float:
    return 1.0 / (1.0 + ctx.fleet.queued(node) / QUEUE_HALF_SCORE)


def _kv_score(ctx: _Context, node: NodeSnapshot) -> float:
    return 1.0 - node.kv_cache_usage


def _bandwidth_score(ctx: _Context, node: NodeSnapshot) -> float:
    knee = settings.DMX_ROUTE_BANDWIDTH_KNEE
    excess = node.memory_bandwidth_utilization - knee
    return 1.0 if excess <= 0 else max(0.0, 1.0 - excess / (1.0 - knee))


def _temperature_score(ctx: _Context, node: NodeSnapshot) -> float:
    derate = settings.DMX_ROUTE_DERATE_TEMPERATURE_C
    drain = settings.DMX_ROUTE_DRAIN_TEMPERATURE_C
    if node.temperature_c <= derate:
        return 1.0
    return max(0.0, 1.0 - (node.temperature_c - derate) / (drain - derate))


def _latency_score(ctx: _Context, node: NodeSnapshot) -> float:
    p95 = ctx.latency.get(node.id)
    if p95 is None:
        return 1.0  # no evidence against the node
    target = ctx.request.model.sla_latency_p95_ms or ctx.best_latency
    return min(1.0, target / p95) if p95 > 0 else 1.0


def _cost_score(ctx: _Context, node: NodeSnapshot) -> float:
    cost = ctx.cost.get(node.id)
    if cost is None or ctx.best_cost is None:
        return 1.0
    return ctx.best_cost / cost


def _affinity_score(ctx: _Context, node: NodeSnapshot) -> float:
    if node.id != ctx.affinity_node:
        return 0.0
    return 1.0 if ctx.fleet.queued(node) < settings.DMX_ROUTE_AFFINITY_MAX_QUEUE else 0.0


def _hardware_score(ctx: _Context, node: NodeSnapshot) -> float:
    return 1.0 if node.profile in ctx.request.preferred_profiles else 0.0


SCORERS: tuple[tuple[str, Callable[[_Context, NodeSnapshot], float]], ...] = (
    ("queue", _queue_score),
    ("kv_cache", _kv_score),
    ("bandwidth", _bandwidth_score),
    ("temperature", _temperature_score),
    ("latency", _latency_score),
    ("cost", _cost_score),
    ("affinity", _affinity_score),
    ("hardware", _hardware_score),
)


def node_latency_p95(stats: GatewayStats, node: NodeSnapshot) -> float | None:
    """P95 latency in ms: what this gateway saw, else what the engine reported for its window."""
    figures = stats.figures(node.id)
    if figures is not None and figures.latency_p95_ms is not None:
        return figures.latency_p95_ms
    return node.e2e_p95_ms


def cost_per_1k_tokens(node: NodeSnapshot) -> float | None:
    """USD per 1,000 generated tokens: the node's hourly price over its measured throughput."""
    if node.hourly_price_usd <= 0 or node.generation_tokens_per_second <= 0:
        return None
    return node.hourly_price_usd / (node.generation_tokens_per_second * 3.6)


def mix64(key: int, node_id: int) -> int:
    """A stable 64-bit mix of a prefix key and a node id (splitmix64's finaliser), the same in
    every gateway process, unlike hash(), so all replicas agree on a prefix's node."""
    z = (key ^ (node_id * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def split_bucket(request_id: str) -> float:
    """The request's place in 0..100 for the canary split: deterministic per request id."""
    return int(request_id[-8:], 16) % 10_000 / 100


def version_pools(model: ModelEntry, request_id: str) -> tuple[str, frozenset[int], frozenset[int]]:
    """The pool a request's canary bucket picks, its version ids, and the fallback pool's."""
    stable = frozenset(v.id for v in model.versions.values() if v.is_stable)
    canaries = model.canaries()
    # Versions neither stable nor canary (rolled back, superseded) get no traffic at all.
    everything = stable | {v.id for v in canaries}
    bucket = split_bucket(request_id)
    edge = 0.0
    for canary in sorted(canaries, key=lambda v: v.id):
        edge += canary.canary_percent
        if bucket < edge:
            return f"canary:{canary.tag}", frozenset({canary.id}), everything
    return "stable", stable, everything


class Router:
    def __init__(
        self,
        *,
        fleet: FleetView,
        breakers: BreakerBoard,
        stats: GatewayStats,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.fleet = fleet
        self.breakers = breakers
        self.stats = stats
        weights = weights if weights is not None else settings.DMX_ROUTE_SCORE_WEIGHTS
        self._scorers = tuple((name, fn, weights.get(name, 0.0)) for name, fn in SCORERS)

    def decide(self, request: RouteRequest, *, exclude: Collection[int] = ()) -> Decision:
        started = time.perf_counter()
        pool, versions, fallback_versions = version_pools(request.model, request.request_id)
        decision = self._decide(request, versions, pool, exclude)
        if decision.node is None and fallback_versions != versions:
            decision = self._decide(request, fallback_versions, "any", exclude)
            decision.fallback = True
        decision.decision_us = round((time.perf_counter() - started) * 1e6, 1)
        return decision

    def _decide(
        self, request: RouteRequest, versions: frozenset[int], pool: str, exclude: Collection[int]
    ) -> Decision:
        ctx = _Context(
            request=request,
            fleet=self.fleet,
            breakers=self.breakers,
            stats=self.stats,
            now=time.time(),
            versions=versions,
        )
        verdicts: list[Verdict] = []
        eligible: list[Verdict] = []
        for node in self.fleet.nodes(request.model.name):
            verdict = Verdict(node=node)
            verdicts.append(verdict)
            if node.id in exclude:
                verdict.rejected_by = "retry"
                continue
            for name, passes in FILTERS:
                if not passes(ctx, node):
                    verdict.rejected_by = name
                    break
            else:
                eligible.append(verdict)
        if not eligible:
            return Decision(node=None, pool=pool, verdicts=verdicts)
        self._prepare(ctx, eligible)
        best: Verdict | None = None
        for verdict in eligible:
            scores = {name: fn(ctx, verdict.node) for name, fn, _ in self._scorers}
            verdict.scores = scores
            verdict.total = sum(weight * scores[name] for name, _, weight in self._scorers)
            if best is None or verdict.total > best.total:
                best = verdict
        return Decision(node=best.node, pool=pool, verdicts=verdicts)

    def _prepare(self, ctx: _Context, eligible: list[Verdict]) -> None:
        """Figures scorers compare across candidates: best latency and cost, the prefix's node."""
        for verdict in eligible:
            node = verdict.node
            ctx.latency[node.id] = node_latency_p95(self.stats, node)
            ctx.cost[node.id] = cost_per_1k_tokens(node)
        latencies = [p for p in ctx.latency.values() if p]
        costs = [c for c in ctx.cost.values() if c]
        ctx.best_latency = min(latencies) if latencies else None
        ctx.best_cost = min(costs) if costs else None
        if ctx.request.affinity is not None:
            key = ctx.request.affinity
            ctx.affinity_node = max(eligible, key=lambda v: mix64(key, v.node.id)).node.id
