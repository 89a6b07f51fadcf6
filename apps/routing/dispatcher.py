"""The gateway's one door into routing: which model serves a request, and which node, held for it.

A Dispatcher is a gateway process's routing state: the model catalog and routing table (aliases
by intent), the fleet as heartbeats last reported it plus this process's own requests in flight,
the circuit breakers, the latency windows and the priority queue of requests waiting for room.
Per request it gives a Dispatch:

    dispatch = dispatcher.dispatch(route_request, clock)
    async with dispatch.connect(send) as sent:   # a node picked, held, and sent the request
        ...                                      # read the answer; NodeFailed if the node fails

`connect` decides (waiting in the priority queue while the model is saturated), probes a
half-open breaker with one request, counts the request in flight on its node, and tries another
node when `send` raises NodeFailed (once, and only before the client has seen a byte, as `send`
is called only then); when every try failed, 503 with Retry-After. The block's exit tells
routing how the request went on its node, once: its latency and first token on a normal exit,
a failure for its breaker when NodeFailed ends it (the client had its first bytes: another node
cannot take it over). Other ends (the request's own error, its time, its client leaving) say
nothing about the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.conf import settings
from redis.asyncio import Redis

from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.keys.gate import MODEL_CHARS
from apps.models.catalog import Catalog, ModelEntry
from apps.models.errors import ModelsErrorCode
from apps.models.selectors import catalog_load
from apps.models.services import CATALOG_VERSION
from apps.routing.breaker import (
    BreakerBoard,
    BreakerState,
    slow_first_token,
    slow_limit_ms,
)
from apps.routing.choices import DecisionOutcome
from apps.routing.decisions import DECISION_STREAM, DecisionSampler, decision_event
from apps.routing.errors import RoutingErrorCode
from apps.routing.fleet import FleetView, Ticket
from apps.routing.queueing import AdmissionQueues, QueueFull
from apps.routing.router import Decision, Router, RouteRequest
from apps.routing.selectors import routing_table_load
from apps.routing.services import ROUTING_TABLE_VERSION
from apps.routing.stats import GatewayStats
from apps.routing.table import RoutingTable, request_tier
from dmxplatform import metrics
from dmxplatform.errors import (
    ApplicationError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
    UpstreamUnavailableError,
)
from dmxplatform.records import storable_text
from dmxplatform.resp import ClusterRespClient, RespClient, RespError
from dmxplatform.stages import Stage, StageClock
from dmxplatform.versioned import reloaded

__all__ = ["Dispatch", "Dispatcher", "NodeFailed", "NodeSnapshot", "Resolution", "RouteRequest"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

# One retry on another node, and only before the client has seen a byte: after that a retry
# could duplicate text the client already holds.
MAX_ATTEMPTS = 2

# Routing's reasons to refuse a request, in /metrics from the start (rate() and alerts see the
# first one).
_QUEUE_TIMEOUT = metrics.gateway_refusals.labels("queue_timeout")
_NO_CAPACITY = metrics.gateway_refusals.labels("no_capacity")
_ROUTING_DECISION = metrics.routing_decision_seconds
_INFLIGHT = metrics.Bound(metrics.gateway_node_inflight)


class NodeFailed(Exception):
    """The node failed the request (unreachable, a 5xx, a stream cut or ended early): raised
    by `send`, another node gets the request; raised from the block, the client keeps what it
    had. Either way the node's breaker counts it."""

    def __init__(self, error: ApplicationError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class Resolution:
    """The model a request goes to and what routing knows of it as the request is resolved."""

    model: ModelEntry
    # The hardware profiles its route prefers (the routing table's; none: any node).
    preferred: frozenset[str]
    # The context a request may use now (context_limit).
    context_limit: int
    # The tier of the routing-table rule it came by (None: none, or a rule without one).
    route_tier: int | None = None

    def priority(self, key_tier: int) -> int:
        """The tier the request runs at, for a key of `key_tier` (table.request_tier)."""
        return request_tier(key_tier, self.route_tier)


def context_limit(model: ModelEntry, kv_pressure: float | None) -> int:
    """The context a request may use now: the model's, or a fraction of it while the fleet
    serving it is short of KV cache (`kv_pressure`, its live nodes' mean KV-cache use: long
    prompts would evict everyone else's)."""
    if kv_pressure is not None and kv_pressure >= settings.DMX_CONTEXT_WATERMARK:
        return max(1, int(model.max_context_tokens * settings.DMX_CONTEXT_PRESSURE_FACTOR))
    return model.max_context_tokens


class Dispatcher:
    def __init__(self, redis: RespClient | ClusterRespClient) -> None:
        """`redis`: the request store's client (breakers)."""
        self.catalog = Catalog()
        self.table = RoutingTable()
        self.fleet = FleetView(stale_after=settings.DMX_NODE_STALE_SECONDS)
        self.breakers = BreakerBoard(redis)
        self.stats = GatewayStats()
        self.queues = AdmissionQueues()
        self.router = Router(fleet=self.fleet, breakers=self.breakers, stats=self.stats)
        self.sampler = DecisionSampler(settings.DMX_DECISION_LOG_PER_SECOND)
        # When the fleet state was last read from Redis (monotonic): a gateway whose view is
        # stale should leave its load balancer; a database outage alone should not make it.
        self.fleet_read_at: float | None = None

    async def refresh(self, redis: Redis) -> None:
        """Reload node state (from the coordination Redis) and breakers (from the request
        store); rebuild the catalog and the routing table when their versions moved (off the
        event loop: they read the database)."""
        pipe = redis.pipeline(transaction=False)
        pipe.hgetall(fleet_key())
        pipe.get(CATALOG_VERSION.key)
        pipe.get(ROUTING_TABLE_VERSION.key)
        # Two servers (or one, by default) that need not wait for each other.
        (nodes, catalog_version, table_version), _ = await asyncio.gather(
            pipe.execute(), self.breakers.refresh()
        )
        self.fleet_read_at = time.monotonic()
        self.fleet.replace(nodes)
        self.queues.wake_all()  # fresh state may have room for whoever waits
        self.table = await reloaded(
            self.table, table_version, lambda version: routing_table_load(version=version)
        )
        self.router.work = self.table.work
        previous = self.catalog
        self.catalog = await reloaded(
            previous,
            catalog_version,
            lambda version: catalog_load(version=version, previous=previous),
        )
        if self.catalog is not previous:
            for model in self.catalog.models:  # a queue of 0 from the start, not no series
                metrics.gateway_queue_depth.labels(model)

    def resolve(
        self, name: str, *, intent: str, request_id: str, allows: Callable[[str], bool]
    ) -> Resolution:
        """The model a request names, or the one its alias routes to for its intent, if it
        exists and `allows` (the key) lets the caller use it (else 404, as OpenAI answers an
        unknown model), with what routing knows of it now."""
        preferred: frozenset[str] = frozenset()
        tier = None
        allowed = allows(name)
        if self.table.is_alias(name):
            route = self.table.resolve(name, intent, request_id)
            if route is not None:
                allowed = allowed or allows(route.model)
                name, preferred, tier = route.model, route.preferred_profiles, route.tier
        entry = self.catalog.get(name)
        if entry is None or not allowed:
            raise NotFoundError(
                f"The model `{storable_text(name, MODEL_CHARS)}` does not exist or you do "
                "not have access to it.",
                param="model",
                code=ModelsErrorCode.MODEL_NOT_FOUND,
            )
        return Resolution(
            entry, preferred, context_limit(entry, self.fleet.kv_pressure(name)), tier
        )

    def served_models(self) -> list[ModelEntry]:
        """The catalog's models that a live node serves now (GET /v1/models)."""
        live = self.fleet.live_models()
        return [model for model in self.catalog.models.values() if model.name in live]

    def dispatch(self, request: RouteRequest, clock: StageClock, *, asked: str) -> Dispatch:
        """`asked`: the model as the client named it (an alias, maybe), for its errors and the
        decision log."""
        return Dispatch(self, request, clock, asked)

    async def observe(
        self,
        node: NodeSnapshot,
        *,
        failed: bool,
        ttft_ms: float | None = None,
        latency_ms: float = 0.0,
        model: ModelEntry | None = None,
        prompt_tokens: int = 0,
        others_on_node: int = 0,
        predicted_ttft_ms: float | None = None,
    ) -> None:
        """Feed a request's outcome on a node to the latency windows and its circuit breaker; a
        slow first token counts against the breaker only as breaker.slow_first_token says."""
        self.stats.record(node.id, ttft_ms=ttft_ms, latency_ms=latency_ms, failed=failed)
        slow = ttft_ms is not None and slow_first_token(
            ttft_ms=ttft_ms,
            limit_ms=slow_limit_ms(model.sla_ttft_p95_ms if model else None, predicted_ttft_ms),
            prompt_tokens=prompt_tokens,
            others_on_node=others_on_node,
            healthy_alternatives=self._healthy_alternatives(node),
        )
        try:
            await self.breakers.record(node.id, failed=failed or slow)
        except (RespError, OSError) as exc:  # RedisUnavailable is an OSError
            logger.warning("breaker of node %s not updated: %s", node.name, exc)

    def _healthy_alternatives(self, node: NodeSnapshot) -> int:
        """Other live nodes of the node's model whose breaker is closed."""
        return sum(
            1
            for other in self.fleet.live_nodes(node.model)
            if other.id != node.id and self.breakers.state(other.id) is BreakerState.CLOSED
        )


class Sent(Generic[T]):
    """The node a request went to and what `send` returned for it."""

    __slots__ = ("answer", "node")

    def __init__(self, node: NodeSnapshot, answer: T) -> None:
        self.node = node
        self.answer = answer


class Dispatch:
    """One request's way to a node: the decision, the wait, the node, and how it went there."""

    def __init__(
        self, dispatcher: Dispatcher, request: RouteRequest, clock: StageClock, asked: str
    ) -> None:
        self._dispatcher = dispatcher
        self._clock = clock
        self.request = request
        self.asked = asked
        self.decision: Decision | None = None
        # The last node picked (the one that answered, or the last that failed).
        self.node: NodeSnapshot | None = None
        self.waited_ms = 0.0
        self.queue_timed_out = False
        # When the request went out (wall clock, as heartbeats are stamped), and how many
        # others its node had then and when its first token came.
        self.sent_at = 0.0
        self.others_on_node = 0
        self._ticket: Ticket | None = None
        self.predicted_ttft_ms: float | None = None
        self.first_token_at: float | None = None  # perf_counter

    @contextlib.asynccontextmanager
    async def connect(self, send: Callable[[NodeSnapshot], Awaitable[T]]) -> AsyncIterator[Sent[T]]:
        """Yield the first node whose `send` returns, and what it returned; a node whose
        `send` raises NodeFailed counts against its breaker and another is tried, once. The
        request counts in flight on its node until the block exits, and the exit reports to
        routing (see the module's docstring); exceptions other than NodeFailed from `send`
        (the request's own time running out) go to the caller."""
        dispatcher = self._dispatcher
        tried: list[int] = []
        failure: ApplicationError | None = None
        self.sent_at = time.time()
        for _ in range(MAX_ATTEMPTS):
            node = await self._pick(tried)
            if node is None:
                break
            tried.append(node.id)
            gauge = _INFLIGHT(node.name)
            # Its work counts on the node until it ends: the router predicts from it.
            ticket = self._ticket = dispatcher.fleet.begin(
                node.id,
                prompt_tokens=self.request.prompt_tokens,
                completion_tokens=self.request.decode_tokens,
                blocks=self.request.prefix_blocks,
            )
            prefill_due = None
            if not self.request.streamed and self.predicted_ttft_ms is not None:
                prefill_due = asyncio.get_running_loop().call_later(
                    self.predicted_ttft_ms / 1000, dispatcher.fleet.prefilled, ticket
                )
            gauge.inc()
            try:
                try:
                    answer = await send(node)
                except NodeFailed as failed:
                    failure = failed.error
                    await dispatcher.observe(node, failed=True)
                    continue
                self.others_on_node = dispatcher.fleet.others_on(node, since=self.sent_at)
                try:
                    yield Sent(node, answer)
                except NodeFailed:
                    await self._report(node, failed=True)
                    raise
                else:
                    await self._report(node, failed=False)
                finally:
                    dispatcher.queues.wake(node.model)
                return
            finally:
                if prefill_due is not None:
                    prefill_due.cancel()
                dispatcher.fleet.end(ticket)
                self._ticket = None
                gauge.dec()
        if failure is not None:
            raise UpstreamUnavailableError(
                f"No node could serve model `{self.asked}` right now ({failure.message}) "
                "Please retry shortly.",
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            )
        decision = self.decision
        if decision is not None and decision.too_long:
            # No node of the model has the context for it: waiting or retrying cannot help.
            raise InvalidRequestError(
                f"No server of model `{self.asked}` has the context for this request: the "
                f"longest holds {decision.longest_context} tokens, and the request needs "
                f"{self.request.prompt_tokens + (self.request.max_tokens or 0)} (prompt and "
                "completion). Please reduce the length of the prompt or completion.",
                param=self.request.prompt_param,
                code=RoutingErrorCode.CONTEXT_LENGTH_EXCEEDED,
            )
        _NO_CAPACITY.inc()
        raise ServiceUnavailableError(
            f"No node can serve model `{self.asked}` right now. Please retry shortly.",
            code=RoutingErrorCode.NO_CAPACITY,
            headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
        )

    async def _pick(self, tried: list[int]) -> NodeSnapshot | None:
        """Decide a node other than those tried; while the model is saturated, wait for room in
        the priority queue, up to DMX_ADMISSION_TIMEOUT_SECONDS (DMX_BATCH_WAIT_SECONDS for a
        batch's line; then 503)."""
        dispatcher, request, clock = self._dispatcher, self.request, self._clock
        model, priority = request.model.name, request.priority
        if tried:
            clock.mark(Stage.CONNECT)  # the try that failed
        exclude = list(tried)
        # A batch's line waits for spare capacity as long as a batch may (its worker sends no
        # more than DMX_BATCH_CONCURRENCY at once): refused, it would only be sent again.
        wait = (
            settings.DMX_BATCH_WAIT_SECONDS
            if request.batch_line
            else settings.DMX_ADMISSION_TIMEOUT_SECONDS
        )
        deadline = time.monotonic() + wait
        waited_from = time.monotonic()
        # Someone of this tier or higher waits already: take a place behind them.
        must_wait = dispatcher.queues.ahead_of(model, priority)
        while True:
            if not must_wait:
                decision = self.decision = dispatcher.router.decide(request, exclude=exclude)
                _ROUTING_DECISION.observe(decision.decision_us / 1_000_000)
                node = decision.node
                if node is not None:
                    breakers = dispatcher.breakers
                    if breakers.state(node.id) is BreakerState.HALF_OPEN and not (
                        await breakers.try_probe(node.id)
                    ):
                        exclude.append(node.id)  # another request is this node's probe
                        continue
                    clock.mark(Stage.ROUTE)
                    self.waited_ms += (time.monotonic() - waited_from) * 1000
                    self.node = node
                    if decision.predicted_ttft_s is not None:
                        self.predicted_ttft_ms = decision.predicted_ttft_s * 1000
                    return node
                clock.mark(Stage.ROUTE)
                if not decision.saturated:
                    return None
            must_wait = False
            remaining = deadline - time.monotonic()
            try:
                woken = remaining > 0 and await dispatcher.queues.wait(model, priority, remaining)
            except QueueFull:
                woken = False
            clock.mark(Stage.QUEUE)
            self.waited_ms += (time.monotonic() - waited_from) * 1000
            waited_from = time.monotonic()
            if not woken:
                self.queue_timed_out = True
                _QUEUE_TIMEOUT.inc()
                raise ServiceUnavailableError(
                    f"Model `{model}` is at capacity and no node freed up in time. "
                    "Please retry shortly.",
                    code=RoutingErrorCode.NO_CAPACITY,
                    headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
                )

    def first_token(self) -> None:
        """The node's first token came: count who else it was serving by then."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self._ticket is not None:
            self._dispatcher.fleet.prefilled(self._ticket)
        if self.node is not None:
            self.others_on_node = max(
                self.others_on_node,
                self._dispatcher.fleet.others_on(self.node, since=self.sent_at),
            )

    async def _report(self, node: NodeSnapshot, *, failed: bool) -> None:
        """Tell the node's latency window and breaker how the request went there: a streamed
        request's first token, the whole request's time; a failure with neither."""
        started = self._clock.started
        ttft_ms = None
        if not failed and self.request.streamed and self.first_token_at is not None:
            ttft_ms = (self.first_token_at - started) * 1000
        await self._dispatcher.observe(
            node,
            failed=failed,
            ttft_ms=ttft_ms,
            latency_ms=0.0 if failed else (time.perf_counter() - started) * 1000,
            model=self.request.model,
            prompt_tokens=self.request.prompt_tokens,
            others_on_node=self.others_on_node,
            predicted_ttft_ms=self.predicted_ttft_ms,
        )

    def decision_entry(
        self,
        *,
        request_id: str,
        tenant_id: int,
        created_at: float,
        intent: str,
        intent_confidence: float | None = None,
        intent_low_confidence: bool = False,
    ) -> tuple[str, bytes] | None:
        """The decision for its log stream (the tenant's stream key, entry): always when it
        found no node, else if sampled."""
        decision = self.decision
        if decision is None or (decision.node is not None and not self._dispatcher.sampler.keep()):
            return None
        if self.queue_timed_out:
            outcome = DecisionOutcome.QUEUE_TIMEOUT
        else:
            outcome = DecisionOutcome.ROUTED if decision.node else DecisionOutcome.NO_CAPACITY
        event = decision_event(
            decision,
            request_id=request_id,
            created_at=created_at,
            requested_model=self.asked,
            model=self.request.model.name,
            intent=intent,
            priority=self.request.priority,
            outcome=outcome,
            waited_ms=self.waited_ms,
            intent_confidence=intent_confidence,
            intent_low_confidence=intent_low_confidence,
        )
        return DECISION_STREAM.of_tenant(tenant_id).key(), event.encode()
