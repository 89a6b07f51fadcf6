"""Which node serves a request: filters, then weighted scorers, then a pick; every step named.

A decision reads only memory (the fleet view, breakers and windows refreshed in the background).
The filters and scorers are plain functions, each score in 0..1 and weighted by
DMX_ROUTE_SCORE_WEIGHTS. Those that depend only on a node's state ("standing": an operator's
drain, KV cache, temperature, bandwidth, latency, cost) are evaluated once per model each time
the fleet view is refreshed; a request pays only for those that depend on it (liveness, breaker,
canary version, context fit, saturation; queue with this gateway's in-flight count, prefix
affinity, hardware preference), a fraction of a microsecond per node:

filters  drained (an operator's cordon: in-flight requests finish, no new ones come), live (up,
         heartbeat fresh), breaker (not open), version (the canary split), context (prompt plus
         completion fit the node), kv_cache (headroom left), temperature (below the drain
         threshold), saturated (the engine's queue plus this gateway's requests beyond the
         engine's batch, below a cap)
scorers  queue (predicted first token: the longer of the queued prompt tokens at the node's
         prefill rate, measured by its engine or from its hardware profile, and the wait for a
         batch slot and KV cache, which running requests free over their predicted decode
         time; then the request's own uncached tokens; plus a small part of its decode time),
         kv_cache, bandwidth (memory-bandwidth pressure), temperature (derating), latency (P95
         against the model's SLA), cost (per 1K tokens), affinity (the share of the prompt's
         block hashes this gateway last sent the node or its engine reports it holds, weighed by
         the prefill it saves against the node's predicted wait; for a prompt no node holds any
         of, the node its last block hashes to; for one without a full block, the node its
         system prompt hashes to), hardware (the routing table's preference)

A request's decode work is predicted (apps.routing.work: its model, intent and key's median
completion from the ledger, capped by max_tokens), not read off max_tokens.

A decision with no node is "saturated", and the request waits in the admission queue, when a
node was refused for what passes soon (queue or KV cache full) and the others only because they
would not serve the request anyway (another version, out of service, a context too short for
it). It is "too long" when every node's context is too short: no wait helps, the request is
refused at once. Anything else (every node down, or open breakers) is refused as no capacity.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from django.conf import settings

from apps.hardware.nodestate import NodeSnapshot
from apps.models.catalog import ModelEntry
from apps.routing.breaker import CLOSED, BreakerBoard, BreakerState
from apps.routing.fleet import FleetSnapshot, FleetView
from apps.routing.stats import GatewayStats
from apps.routing.work import WorkTable
from inference.hardware.profiles import profile_named, serving_rates
from inference.prefix_cache import GROUP_TOKENS, chain_hashes

# Predictions use a reference model's figures: routing compares nodes serving the same model, so
# the ratios between GPUs matter, not the absolute rate (an 8B dense model in BF16, Llama-3's
# 128 KiB of KV per token).
REFERENCE_PARAMS_BILLION = 8.0
REFERENCE_KV_BYTES_PER_TOKEN = 131_072
# A node whose profile is unknown (or the CPU profile) predicts as a modest GPU would.
FALLBACK_PREFILL_TOKENS_PER_SECOND = 2_000.0
FALLBACK_DECODE_STEPS_PER_SECOND = 20.0
# A queued request whose size this process does not know (another gateway's, or one counted
# before its work was recorded) is taken to have this many prompt tokens.
UNKNOWN_PROMPT_TOKENS = 1_024
# A running request of another gateway's may still be prefilling, and holds a batch slot and a
# share of every decode step: it counts as this share of an unknown prompt.
UNKNOWN_RUNNING_SHARE = 0.5
# Predicted waits shorter than this barely differ for a user: the queue score compares
# (best + slack) with (this node's + slack), so small loads spread as before. A tenth of a
# second: a chunked prefill step of a short prompt takes about that on an A100.
PREDICTION_SLACK_SECONDS = 0.1
# The queue score weighs a second of predicted decoding this much against a second of waiting for
# the first token: a user sees the first token's delay whole, and a slow stream far less; the
# term only keeps a long predicted generation off a node that decodes many times slower (an L4's
# 13 tokens/s against an H100's 70). Chosen on the replay's tuning slices (Mooncake's requests
# 1,000-3,999 and Azure's 1,000-3,499; the figures are reported on later ones): 0.5 and
# 0.1 cost the first token whole seconds at 80-95% load (a busy A100's stream slows to 18
# tokens/s while it prefills, and the term sent its short prompts to queue on H100s); 0.01 kept
# the best TTFT p95 and, against 0, the lower end-to-end p95 on Mooncake's long prompts.
DECODE_SECONDS_WEIGHT = 0.01
# The affinity of a prompt no node holds any of for the node its hash makes its home: going
# there saves nothing now (only later prompts sharing it find it there), so the home breaks
# near-ties between nodes and never outweighs a shorter predicted wait elsewhere.
NEW_PROMPT_HOME_SCORE = 0.1
# A node's measured prefill rate is held within this factor of its model's nodes' (geometric)
# mean, each in terms of its own profile. One window's concurrency sets a reading apart: two
# identical CPU engines on one machine once read 18,050 and 1,672 tokens/s, and a long prompt
# went behind two unprefilled ones on the "fast" node. Within 2x, a node that really is slower
# (shared, throttled) still loses to its twin, by up to four times.
PEER_PREFILL_SPREAD = 2.0
# Prompt tokens per prefix hash (the gateway's and the engines' alike).
PREFIX_BLOCK_TOKENS = GROUP_TOKENS
_MASK64 = (1 << 64) - 1
SATURATED = "saturated"
# Refusals that pass once running requests finish: the request queues for them.
SPARE = "spare"
_SOON = frozenset({SATURATED, "kv_cache", SPARE})
# Refusals of nodes that would not serve it anyway (another version, out of service, a context
# too short for this request): others that will serve it soon make the request wait for them.
CONTEXT = "context"
_ELSEWHERE = frozenset({"version", "drained", "live", "breaker", CONTEXT})


@dataclass(slots=True)
class RouteRequest:
    request_id: str
    model: ModelEntry
    prompt_tokens: int
    # Tokens it will likely generate: the router predicts them (WorkTable.predict) when None.
    completion_tokens: int | None = None
    priority: int = 1
    # The client's cap on the completion (None: none sent): the context it needs on a node,
    # and the most the prediction may say.
    max_tokens: int | None = None
    # What the prediction is looked up by: the request's intent and its key.
    intent: str = ""
    key_id: int | None = None
    affinity: int | None = None
    preferred_profiles: frozenset[str] = frozenset()
    # The prompt's token ids, where the model's tokenizer counted them (a single prompt), and
    # their chained group hashes (inference.prefix_cache), as engines report what they cache:
    # made from the ids here, or given (a trace replayed has the hashes only).
    prompt_ids: Sequence[int] = ()
    prefix_blocks: tuple[int, ...] = ()
    # The request's field that holds its prompt, which a refusal for its length names.
    prompt_param: str = "messages"
    # Whether the gateway sees the first token (a stream). For a request it does not, the
    # prompt stops counting as queued prefill work when its predicted first token is due.
    streamed: bool = True
    # A line of a batch (/v1/batches): it runs on spare capacity only (the `spare` filter).
    batch_line: bool = False

    def __post_init__(self) -> None:
        if self.prompt_ids and not self.prefix_blocks:
            self.prefix_blocks = chain_hashes(self.prompt_ids)

    @property
    def decode_tokens(self) -> int:
        """The predicted completion (0 before the router predicted it)."""
        return self.completion_tokens or 0


@dataclass(slots=True)
class Verdict:
    node: NodeSnapshot
    rejected_by: str | None = None
    scores: dict[str, float] | None = None  # the request's scorers'
    total: float = 0.0
    # The standing scorers', shared by every decision of one fleet refresh (not copied: a
    # decision reads them only when it is traced).
    standing_scores: dict[str, float] | None = None


@dataclass(slots=True)
class Decision:
    node: NodeSnapshot | None
    pool: str
    verdicts: list[Verdict]
    fallback: bool = False
    decision_us: float = 0.0
    # Seconds to the chosen node's first token as the router predicted them (breakers compare).
    predicted_ttft_s: float | None = None

    @property
    def saturated(self) -> bool:
        """No node chosen, and a node was refused only for what passes soon: a full queue or a
        full KV cache (requests finish and free it), so the request waits for room."""
        if self.node is not None:
            return False
        reasons = {v.rejected_by for v in self.verdicts}
        return bool(reasons & _SOON) and reasons <= _SOON | _ELSEWHERE

    @property
    def too_long(self) -> bool:
        """No node chosen, and every node's context is too short for the request: no wait or
        retry would serve it."""
        return (
            self.node is None
            and bool(self.verdicts)
            and all(v.rejected_by == CONTEXT for v in self.verdicts)
        )

    @property
    def longest_context(self) -> int:
        """The longest context among the decision's nodes."""
        return max((v.node.max_model_len for v in self.verdicts), default=0)

    def trace(self) -> list[dict]:
        """The decision as the log keeps it: each candidate's verdict and scores."""
        return [
            {
                "node": v.node.name,
                "version": v.node.version_tag,
                "rejected_by": v.rejected_by,
                "scores": {
                    k: round(s, 4)
                    for k, s in {**(v.standing_scores or {}), **(v.scores or {})}.items()
                },
                "total": round(v.total, 4),
            }
            for v in self.verdicts
        ]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The settings filters and scorers read, copied once: Django's lazy settings cost a
    microsecond or more per attribute, which per node and decision adds up."""

    kv_cache_limit: float
    drain_temperature: float
    derate_temperature: float
    saturation_queue: int
    bandwidth_knee: float
    breaker_cooldown: float
    batch_kv_cache: float
    batch_busy: float
    batch_ttft_share: float

    @classmethod
    def from_settings(cls) -> Thresholds:
        return cls(
            kv_cache_limit=settings.DMX_ROUTE_KV_CACHE_LIMIT,
            drain_temperature=settings.DMX_ROUTE_DRAIN_TEMPERATURE_C,
            derate_temperature=settings.DMX_ROUTE_DERATE_TEMPERATURE_C,
            saturation_queue=settings.DMX_ROUTE_SATURATION_QUEUE,
            bandwidth_knee=settings.DMX_ROUTE_BANDWIDTH_KNEE,
            breaker_cooldown=settings.DMX_BREAKER_COOLDOWN_SECONDS,
            batch_kv_cache=settings.DMX_BATCH_MAX_KV_CACHE,
            batch_busy=settings.DMX_BATCH_MAX_BUSY,
            batch_ttft_share=settings.DMX_BATCH_TTFT_SLA_SHARE,
        )


@dataclass(slots=True)
class _Standing:
    """A node's request-independent verdict and weighted scores, for one fleet refresh."""

    node: NodeSnapshot
    rejected_by: str | None
    scores: dict[str, float]
    total: float


@dataclass(slots=True)
class _Context:
    limits: Thresholds
    fleet: FleetView
    breakers: BreakerBoard
    stats: GatewayStats
    now: float
    model: ModelEntry
    request: RouteRequest | None = None
    versions: frozenset[int] = frozenset()
    affinity_node: int | None = None
    best_cost: float | None = None
    latency: dict[int, float | None] = field(default_factory=dict)
    cost: dict[int, float | None] = field(default_factory=dict)
    ttft: dict[int, float] = field(default_factory=dict)  # predicted seconds to first token
    wait: dict[int, float] = field(default_factory=dict)  # of them, before its prefill starts
    rates: dict[int, NodeRates] = field(default_factory=dict)
    predicted: dict[int, float] = field(default_factory=dict)  # ttft plus weighted decode
    matched: dict[int, int] = field(default_factory=dict)  # leading prefix blocks per node
    best_predicted: float = 0.0


Filter = Callable[[_Context, NodeSnapshot], bool]
Scorer = Callable[[_Context, NodeSnapshot], float]


# Standing filters and scorers: the node's reported state only. ---------------------------------


def _not_drained(ctx: _Context, node: NodeSnapshot) -> bool:
    return not node.drained


def _kv_headroom(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.engine.kv_cache_usage < ctx.limits.kv_cache_limit


def _cool_enough(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.temperature_c < ctx.limits.drain_temperature


def _kv_score(ctx: _Context, node: NodeSnapshot) -> float:
    return 1.0 - node.engine.kv_cache_usage


def _bandwidth_score(ctx: _Context, node: NodeSnapshot) -> float:
    knee = ctx.limits.bandwidth_knee
    excess = node.memory_bandwidth_utilization - knee
    return 1.0 if excess <= 0 else max(0.0, 1.0 - excess / (1.0 - knee))


def _temperature_score(ctx: _Context, node: NodeSnapshot) -> float:
    derate = ctx.limits.derate_temperature
    drain = ctx.limits.drain_temperature
    if node.temperature_c <= derate:
        return 1.0
    return max(0.0, 1.0 - (node.temperature_c - derate) / (drain - derate))


def _latency_score(ctx: _Context, node: NodeSnapshot) -> float:
    """The node's P95 end-to-end latency against the model's SLA. Without an SLA there is
    nothing to judge it by: the nodes' P95s are not compared with each other, since they say
    more about the work each was given (a node that served long generations in the window had
    a P95 many times another's, and once took none of the short requests two idle nodes should
    share); a node's speed is the queue score's, from its measured rates."""
    p95 = ctx.latency.get(node.id)  # read only for a model with an SLA (Router.standing)
    if p95 is None or p95 <= 0:
        return 1.0  # no evidence against the node
    return min(1.0, ctx.model.sla_latency_p95_ms / p95)


def _cost_score(ctx: _Context, node: NodeSnapshot) -> float:
    cost = ctx.cost.get(node.id)
    if cost is None or ctx.best_cost is None:
        return 1.0
    return ctx.best_cost / cost


STANDING_FILTERS: tuple[tuple[str, Filter], ...] = (
    ("drained", _not_drained),
    ("kv_cache", _kv_headroom),
    ("temperature", _cool_enough),
)
STANDING_SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("kv_cache", _kv_score),
    ("bandwidth", _bandwidth_score),
    ("temperature", _temperature_score),
    ("latency", _latency_score),
    ("cost", _cost_score),
)


# Request filters and scorers. ------------------------------------------------------------------


def _live(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.is_up(now=ctx.now, stale_after=ctx.fleet.stale_after)


def _breaker(ctx: _Context, node: NodeSnapshot) -> bool:
    breaker = ctx.breakers.get(node.id)
    return breaker is CLOSED or (
        breaker.current(ctx.now, ctx.limits.breaker_cooldown) != BreakerState.OPEN
    )


def _version(ctx: _Context, node: NodeSnapshot) -> bool:
    return node.version_id in ctx.versions


def _context(ctx: _Context, node: NodeSnapshot) -> bool:
    request = ctx.request
    # The engine refuses a prompt whose max_tokens would not fit (without one, it needs a token).
    return request.prompt_tokens + (request.max_tokens or 1) <= node.max_model_len


def _not_saturated(ctx: _Context, node: NodeSnapshot) -> bool:
    # The engine's own queue, plus what this gateway has sent beyond the engine's batch: those
    # requests wait in its queue before the next heartbeat can say so. A node whose batch size is
    # unknown has every request in flight counted as queued, the cautious reading.
    inflight = ctx.fleet.in_flight(node.id)
    queued = node.engine.num_requests_waiting + max(inflight - node.max_num_seqs, 0)
    return queued < ctx.limits.saturation_queue


def _spare(ctx: _Context, node: NodeSnapshot) -> bool:
    """A batch's request goes only to capacity no one else uses: nothing waiting in the
    engine's queue, its KV cache and its running batch well short of full, and, for a model
    with a TTFT target, its first tokens of late well inside it (the engine's own p95 over its
    last heartbeat: what sharing its steps with batch lines costs everyone else shows there
    first). Refused, it waits in the priority queue behind every interactive tier; the node's
    other requests never wait for it."""
    engine, limits = node.engine, ctx.limits
    busy = max(engine.num_requests_running, ctx.fleet.in_flight(node.id))
    target = ctx.model.sla_ttft_p95_ms
    return (
        engine.num_requests_waiting == 0
        and engine.kv_cache_usage < limits.batch_kv_cache
        and busy < max(node.max_num_seqs, 1) * limits.batch_busy
        and not (
            target and engine.ttft_p95_ms and engine.ttft_p95_ms > target * limits.batch_ttft_share
        )
    )


def _queue_score(ctx: _Context, node: NodeSnapshot) -> float:
    predicted = ctx.predicted[node.id]  # decide() predicts every eligible node when this runs
    return (ctx.best_predicted + PREDICTION_SLACK_SECONDS) / (predicted + PREDICTION_SLACK_SECONDS)


def _affinity_score(ctx: _Context, node: NodeSnapshot) -> float:
    """The share of the prompt the node holds, weighed by what it saves against what the node
    makes the request wait: a cached prefix saves its prefill time, which counts for little on
    a node whose queue or full KV cache holds the request longer than that."""
    blocks = ctx.request.prefix_blocks
    if blocks and ctx.affinity_node is None:
        matched = ctx.matched[node.id]
        if not matched:
            return 0.0
        rates = ctx.rates.get(node.id) or node_rates(ctx.fleet, node)
        saved = min(matched * PREFIX_BLOCK_TOKENS, ctx.request.prompt_tokens) / rates.prefill
        return matched / len(blocks) * saved / (saved + _wait(ctx, node))
    if node.id != ctx.affinity_node:
        return 0.0
    # A home (no node holds any of the prompt yet) saves nothing now: it yields to any wait.
    damping = PREDICTION_SLACK_SECONDS / (PREDICTION_SLACK_SECONDS + _wait(ctx, node))
    return (NEW_PROMPT_HOME_SCORE if blocks else 1.0) * damping


def _wait(ctx: _Context, node: NodeSnapshot) -> float:
    """The node's predicted wait before the request's own prefill starts."""
    wait = ctx.wait.get(node.id)
    if wait is None:
        wait = ctx.wait[node.id] = predicted_wait(ctx.fleet, node, ctx.request)
    return wait


def _hardware_score(ctx: _Context, node: NodeSnapshot) -> float:
    return 1.0 if node.profile in ctx.request.preferred_profiles else 0.0


REQUEST_FILTERS: tuple[tuple[str, Filter], ...] = (
    ("live", _live),
    ("breaker", _breaker),
    ("version", _version),
    (CONTEXT, _context),
    (SATURATED, _not_saturated),
)
# A batch's line (/v1/batches) passes one more: interactive requests never pay for it.
BATCH_LINE_FILTERS = (*REQUEST_FILTERS, (SPARE, _spare))
REQUEST_SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("queue", _queue_score),
    ("affinity", _affinity_score),
    ("hardware", _hardware_score),
)


def node_latency_p95(stats: GatewayStats, node: NodeSnapshot) -> float | None:
    """P95 latency in ms: what this gateway saw, else what the engine reported for its window."""
    figures = stats.figures(node.id)
    if figures is not None and figures.latency_p95_ms is not None:
        return figures.latency_p95_ms
    return node.engine.e2e_p95_ms


@functools.cache
def profile_rates(profile: str | None, gpu_count: int) -> tuple[float, float, int]:
    """Prefill tokens per second, decode steps per second and KV-cache tokens of the reference
    model on a node of this hardware profile, from its datasheet figures (a fallback for unknown
    hardware, whose KV cache is unknown: 0)."""
    found = profile_named(profile) if profile else None
    rates = found and serving_rates(
        found,
        params_billion=REFERENCE_PARAMS_BILLION,
        kv_bytes_per_token=REFERENCE_KV_BYTES_PER_TOKEN,
        gpu_count=max(gpu_count, 1),
    )
    if rates is None:
        return FALLBACK_PREFILL_TOKENS_PER_SECOND, FALLBACK_DECODE_STEPS_PER_SECOND, 0
    return rates.prefill_tokens_per_second, rates.decode_steps_per_second, rates.kv_cache_tokens


@dataclass(frozen=True, slots=True)
class NodeRates:
    prefill: float  # prompt tokens per second
    decode: float  # tokens per second, per sequence
    kv_tokens: int  # tokens its KV cache holds


def node_rates(fleet: FleetView, node: NodeSnapshot) -> NodeRates:
    """How fast the node prefills and decodes, once per fleet refresh.

    Prefill: as its hardware profile predicts for the reference model, scaled by how the
    model's measured nodes compare with their own profiles' predictions (so that a measured and
    an unmeasured node of one model compare in that model's terms); a node that measured its
    own rate takes that, held within PEER_PREFILL_SPREAD of the scaled prediction.
    Decode: one sequence's speed as its engine measured it (the gaps between its tokens), else
    the profile's step rate. Not generated tokens over running requests: a heartbeat just after
    four requests started reads four tokens in its window and took that node for a slow
    decoder (a routing e2e once sent a long prompt behind two unprefilled ones for it)."""
    return fleet.snapshot.derive(("rates", node.id), lambda: _node_rates(fleet, node))


def _node_rates(fleet: FleetView, node: NodeSnapshot) -> NodeRates:
    engine = node.engine
    profile_prefill, profile_decode, kv_tokens = profile_rates(node.profile, node.gpu_count)
    expected = profile_prefill * _prefill_scale(fleet, node.model)
    prefill = engine.prefill_tokens_per_second
    if prefill <= 0:
        prefill = expected
    else:
        prefill = min(max(prefill, expected / PEER_PREFILL_SPREAD), expected * PEER_PREFILL_SPREAD)
    decode = engine.decode_tokens_per_second
    if decode <= 0:
        decode = profile_decode
    # Unknown hardware: at least one request of the node's longest context fits (vLLM
    # refuses to start otherwise).
    return NodeRates(prefill=prefill, decode=decode, kv_tokens=max(kv_tokens, node.max_model_len))


def _prefill_scale(fleet: FleetView, model: str) -> float:
    """The geometric mean ratio of measured to profile-predicted prefill rate over the model's
    nodes that measured one (1.0 when none has): ratios, so one reading ten times off moves it
    by its root, not by half the reading."""

    def scale() -> float:
        ratios = [
            node.engine.prefill_tokens_per_second / profile_rates(node.profile, node.gpu_count)[0]
            for node in fleet.nodes(model)
            if node.engine.prefill_tokens_per_second > 0
        ]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0

    return fleet.snapshot.derive(("prefill_scale", model), scale)


def predicted_ttft(
    fleet: FleetView, node: NodeSnapshot, request: RouteRequest, matched: int | None = None
) -> float:
    """Seconds until the request's first token on the node: its wait (predicted_wait), then
    its own uncached prompt tokens at the node's prefill rate."""
    own = request.prompt_tokens
    if matched is None:
        matched = fleet.cached_blocks(node.id, request.prefix_blocks)
    own -= min(matched * PREFIX_BLOCK_TOKENS, own)
    return predicted_wait(fleet, node, request) + own / node_rates(fleet, node).prefill


def predicted_wait(
    fleet: FleetView, node: NodeSnapshot, request: RouteRequest, rates: NodeRates | None = None
) -> float:
    """Seconds before the request's prefill starts on the node: the longer of

    - the prompt tokens queued ahead of it (what this process sent and has no first token for,
      plus the engine's other requests at an assumed size) at the node's prefill rate, and
    - the wait for room: a batch slot (--max-num-seqs) and KV cache for its prompt and
      predicted completion. None while the node's requests and queued prompts leave room;
      beyond that, running requests must finish first. They finish over their predicted decode
      time (this process's predictions of its own, else this request's), each on average
      half-way through: freeing a share of the slots, or of what the cache holds, takes about
      that share of it.

    Per node and decision: plain arithmetic, no call it can avoid."""
    if rates is None:
        rates = node_rates(fleet, node)
    engine = node.engine
    work = fleet.work.get(node.id)
    if work is not None:
        tracked = work.requests
        queued = work.prefill_tokens
        # Ours that the engine's last heartbeat counted: those in flight less those sent since
        # (ended ones it still counts, too).
        counted = tracked - work.new_requests
        prefilling = work.prefilling - work.new_prefilling
        typical = work.decode_tokens / tracked if tracked else request.decode_tokens
    else:
        tracked = queued = counted = prefilling = 0
        typical = request.decode_tokens
    # The engine's requests that are not ours: the waiting ones whole, the running ones at a
    # share.
    waiting = engine.num_requests_waiting
    others = engine.num_requests_running + waiting - (counted if counted > 0 else 0)
    if others > 0:
        others_waiting = waiting - (prefilling if prefilling > 0 else 0)
        others_waiting = min(others, others_waiting) if others_waiting > 0 else 0
        queued += (others_waiting + (others - others_waiting) * UNKNOWN_RUNNING_SHARE) * (
            UNKNOWN_PROMPT_TOKENS
        )
    else:
        others = 0
    wait = queued / rates.prefill
    # Room.
    slots = node.max_num_seqs
    short = tracked + others + 1 - slots if slots else 0
    capacity = rates.kv_tokens
    held = engine.kv_cache_usage * capacity
    excess = held + queued + request.prompt_tokens + request.decode_tokens - capacity
    if short > 0 or (excess > 0 and held > 0):
        decode_seconds = typical / rates.decode
        if short > 0:
            wait = max(wait, short / slots * decode_seconds)
        if excess > 0 and held > 0:
            wait = max(wait, excess / held * decode_seconds)
    return wait


def cost_per_1k_tokens(node: NodeSnapshot) -> float | None:
    """USD per 1,000 generated tokens: the node's hourly price over its throughput, the more
    of what it measured and what its hardware profile can decode at half its batch."""
    if node.hourly_price_usd <= 0:
        return None
    capacity = 0.0
    if node.profile and node.max_num_seqs:
        capacity = profile_rates(node.profile, node.gpu_count)[1] * node.max_num_seqs / 2
    throughput = max(node.engine.generation_tokens_per_second, capacity)
    if throughput <= 0:
        return None
    return node.hourly_price_usd / (throughput * 3.6)


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
        work: WorkTable | None = None,
    ) -> None:
        self.fleet = fleet
        self.breakers = breakers
        self.stats = stats
        # Predicted decode work by model, intent and key (published with the routing table).
        self.work = work if work is not None else WorkTable()
        self.limits = Thresholds.from_settings()
        weights = weights if weights is not None else settings.DMX_ROUTE_SCORE_WEIGHTS
        # Scorers whose weight is zero are not run.
        self._standing_scorers = tuple(
            (name, fn, weights[name]) for name, fn in STANDING_SCORERS if weights.get(name)
        )
        self._request_scorers = tuple(
            (name, fn, weights[name]) for name, fn in REQUEST_SCORERS if weights.get(name)
        )
        self._request_weights = {name for name, _, _ in self._request_scorers}
        # Per model, the standing of its nodes in the fleet snapshot it was computed on.
        self._standing: dict[str, tuple[FleetSnapshot, list[_Standing]]] = {}

    def decide(self, request: RouteRequest, *, exclude: Collection[int] = ()) -> Decision:
        started = time.perf_counter()
        if request.completion_tokens is None:
            request.completion_tokens = self.work.predict(
                request.model.name, request.intent, request.key_id, request.max_tokens
            )
        pool, versions, fallback_versions = version_pools(request.model, request.request_id)
        decision = self._decide(request, versions, pool, exclude)
        if decision.node is None and fallback_versions != versions:
            decision = self._decide(request, fallback_versions, "any", exclude)
            decision.fallback = True
        decision.decision_us = round((time.perf_counter() - started) * 1e6, 1)
        return decision

    def standing(self, model: ModelEntry) -> list[_Standing]:
        """The model's nodes with their standing verdicts and scores, as of the last refresh."""
        cached = self._standing.get(model.name)
        snapshot = self.fleet.snapshot
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        nodes = self.fleet.nodes(model.name)
        ctx = _Context(
            limits=self.limits,
            fleet=self.fleet,
            breakers=self.breakers,
            stats=self.stats,
            now=time.time(),
            model=model,
        )
        for node in nodes:
            if model.sla_latency_p95_ms:  # nothing to judge a node's latency by otherwise
                ctx.latency[node.id] = node_latency_p95(self.stats, node)
            ctx.cost[node.id] = cost_per_1k_tokens(node)
        costs = [c for c in ctx.cost.values() if c]
        ctx.best_cost = min(costs) if costs else None
        standing = []
        for node in nodes:
            reason = next((name for name, ok in STANDING_FILTERS if not ok(ctx, node)), None)
            scores = {name: fn(ctx, node) for name, fn, _ in self._standing_scorers}
            total = sum(weight * scores[name] for name, _, weight in self._standing_scorers)
            standing.append(_Standing(node=node, rejected_by=reason, scores=scores, total=total))
        self._standing[model.name] = (snapshot, standing)
        return standing

    def _decide(
        self, request: RouteRequest, versions: frozenset[int], pool: str, exclude: Collection[int]
    ) -> Decision:
        ctx = _Context(
            limits=self.limits,
            fleet=self.fleet,
            breakers=self.breakers,
            stats=self.stats,
            now=time.time(),
            model=request.model,
            request=request,
            versions=versions,
        )
        verdicts: list[Verdict] = []
        eligible: list[tuple[Verdict, _Standing]] = []
        filters = BATCH_LINE_FILTERS if request.batch_line else REQUEST_FILTERS
        for standing in self.standing(request.model):
            node = standing.node
            verdict = Verdict(node=node, rejected_by=standing.rejected_by)
            verdicts.append(verdict)
            if node.id in exclude:
                verdict.rejected_by = "retry"
            if verdict.rejected_by is None:
                for name, passes in filters:
                    if not passes(ctx, node):
                        verdict.rejected_by = name
                        break
                else:
                    eligible.append((verdict, standing))
        if not eligible:
            return Decision(node=None, pool=pool, verdicts=verdicts)
        blocks = request.prefix_blocks
        key = request.affinity
        if blocks:
            cached = self.fleet.cached_blocks
            ctx.matched = {v.node.id: cached(v.node.id, blocks) for v, _ in eligible}
            # A prompt no node holds any of gets a home by its own hash: new prompts spread,
            # and every gateway sends the same one to the same node.
            key = None if any(ctx.matched.values()) else blocks[-1]
        if "queue" in self._request_weights:
            # The queue score weighs each node's predicted first token plus its decode time at
            # DECODE_SECONDS_WEIGHT; the chosen node's first token is kept for its breaker.
            fleet, matched = self.fleet, ctx.matched
            decode_tokens = request.decode_tokens
            for verdict, _ in eligible:
                node = verdict.node
                rates = ctx.rates[node.id] = node_rates(fleet, node)
                wait = ctx.wait[node.id] = predicted_wait(fleet, node, request, rates)
                own = request.prompt_tokens
                own -= min(matched.get(node.id, 0) * PREFIX_BLOCK_TOKENS, own)
                ttft = ctx.ttft[node.id] = wait + own / rates.prefill
                ctx.predicted[node.id] = ttft + DECODE_SECONDS_WEIGHT * decode_tokens / rates.decode
            ctx.best_predicted = min(ctx.predicted.values())
        if key is not None:
            ctx.affinity_node = max(eligible, key=lambda pair: mix64(key, pair[0].node.id))[
                0
            ].node.id
        best: Verdict | None = None
        for verdict, standing in eligible:
            node = verdict.node
            scores = {}
            total = standing.total
            for name, fn, weight in self._request_scorers:
                value = scores[name] = fn(ctx, node)
                total += weight * value
            verdict.standing_scores, verdict.scores, verdict.total = standing.scores, scores, total
            if best is None or total > best.total:
                best = verdict
        ttft = ctx.ttft.get(best.node.id)
        if ttft is None:  # the queue scorer is weighted out: predict for the breaker alone
            ttft = predicted_ttft(self.fleet, best.node, request, ctx.matched.get(best.node.id))
        return Decision(node=best.node, pool=pool, verdicts=verdicts, predicted_ttft_s=ttft)
