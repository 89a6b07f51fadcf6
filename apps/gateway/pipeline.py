"""One completion request through the gateway, stage by stage.

authenticate (key, client network, signature) -> parse -> resolve model -> screen the prompt ->
classify intent -> count prompt tokens against the context allowed now -> admit against limits
and quotas (one Redis round trip, or none from the process's lease) -> route and connect ->
relay, through the output filter -> settle (one Redis call: refund, free the slot, append usage).

Each stage is timed; the timings go into the usage record with the request id. The settle call
with the usage event is in the kernel's socket to Redis before the response's last bytes leave,
so a response a client received always has its record even if this process dies, and Redis's
answer is awaited after the response. A request is billed exactly: prompt and completion tokens
as vLLM counted them, nothing for a node that failed before the first token, what was generated
when a client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from typing import Any

from django.conf import settings

from apps.gateway import sse, tracing
from apps.gateway.admission import admit, reservation
from apps.gateway.auth import authenticate, check_network, check_signature, check_usable
from apps.gateway.clients import client_address
from apps.gateway.context import (
    check_context,
    check_context_bound,
    context_limit,
    prompt_tokens,
)
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.intent import classify
from apps.gateway.outputs import StreamEditor, filter_response
from apps.gateway.prompts import affinity_key, intent_text, screen_prompt
from apps.gateway.request_ids import accept_client_request_id
from apps.gateway.runtime import GatewayRuntime, get_runtime
from apps.gateway.schemas import CompletionRequest, Endpoint, parse_json, validate_completion
from apps.gateway.stages import GATEWAY_STAGES, Stage
from apps.gateway.upstream import connect, stream_error, upstream_error
from apps.gateway.upstream_http import (
    UpstreamConnectionError,
    UpstreamResponse,
    UpstreamTimeout,
)
from apps.hardware.fleet import NodeSnapshot
from apps.keys.choices import PriorityTier, UsageStatus
from apps.keys.keycache import KeyRecord
from apps.keys.ledger import MODEL_CHARS, UNRECORDED, USAGE_STREAM, UsageEvent
from apps.keys.ratelimit import Admission
from apps.models.catalog import ModelEntry
from apps.routing.breaker import BreakerState
from apps.routing.choices import DecisionOutcome
from apps.routing.decisions import DECISION_STREAM, DecisionEvent, decision_event
from apps.routing.queueing import QueueFull
from apps.routing.router import Decision, RouteRequest
from dmxplatform import metrics
from dmxplatform.errors import (
    ApplicationError,
    GatewayTimeoutError,
    NotFoundError,
    ServiceUnavailableError,
    UpstreamError,
)
from dmxplatform.logs import bind_request
from dmxplatform.records import storable_text
from dmxplatform.resp import RedisUnavailable
from dmxplatform.responses import EVENT_STREAM, Headers, header, read_body, send_error, send_json

logger = logging.getLogger(__name__)

# Request bodies above this are refused before parsing: 8 MiB holds any prompt a 1M-token
# context accepts, and stops a client from making the gateway buffer arbitrary amounts.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Without a tokenizer for the model, a prompt's tokens are estimated from its length.
CHARS_PER_TOKEN = 4


def new_request_id() -> str:
    return "req_" + os.urandom(16).hex()


def resolve_model(
    runtime: GatewayRuntime, key: KeyRecord, name: str, intent: str, request_id: str
) -> tuple[ModelEntry, frozenset[str]]:
    """The model a request names, or the one its alias routes to for its intent (with the
    routing table's hardware preference), if it exists and the key may use it."""
    preferred: frozenset[str] = frozenset()
    allowed = key.allows(name)
    if runtime.routing_table.is_alias(name):
        route = runtime.routing_table.resolve(name, intent, request_id)
        if route is not None:
            allowed = allowed or key.allows(route.model)
            name, preferred = route.model, route.preferred_profiles
    entry = runtime.catalog.get(name)
    if entry is None or not allowed:
        raise NotFoundError(
            f"The model `{storable_text(name, MODEL_CHARS)}` does not exist or you do not have "
            "access to it.",
            param="model",
            code=GatewayErrorCode.MODEL_NOT_FOUND,
        )
    return entry, preferred


class CompletionCall:
    """The state of one chat or text completion request, from first byte to usage record."""

    def __init__(
        self,
        endpoint: Endpoint,
        scope: dict[str, Any],
        receive,
        send,
        *,
        key: KeyRecord | None = None,
    ) -> None:
        """`key`: the key a caller inside the platform acts for, its user already signed in
        (the portal's playground); otherwise the request's bearer key."""
        self.endpoint = endpoint
        self.scope = scope
        self.receive = receive
        self.send = send
        self.request_id = new_request_id()
        self.received_at = time.time()
        self.trace = tracing.start(endpoint, self.request_id)
        self.clock = self.trace.new_clock()
        self._t0 = self.clock.started
        self.client_request_id = ""
        self.headers: Headers = [(b"x-request-id", self.request_id.encode())]
        self.key = key
        self.request: CompletionRequest | None = None
        self.admission: Admission | None = None
        self.route_request: RouteRequest | None = None
        self.decision: Decision | None = None
        self.node: NodeSnapshot | None = None
        self.waited_ms = 0.0
        self.queue_timeout = False
        self.editor: StreamEditor | None = None
        self.http_status = 200
        self.outcome = UsageStatus.OK
        self.error_code = ""
        self.intent = ""
        self.estimated_tokens: int | None = None
        self.context_limit: int | None = None
        self.reserved = 0
        self.flags: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        # When the request went to its node (wall clock, as heartbeats are stamped), and how
        # many others the node had then and when its first token came.
        self.sent_at = 0.0
        self.others_on_node = 0
        self.response_started = False
        self.settled = False
        # The settle call on its way to Redis (its reply to come), and the entries it carries.
        self._settlement: tuple[asyncio.Future, list[tuple[str, bytes]]] | None = None

    async def run(self) -> None:
        runtime: GatewayRuntime | None = None
        try:
            self.client_request_id = accept_client_request_id(self.scope, self.headers)
            bind_request(
                self.request_id,
                client_request_id=self.client_request_id,
                trace_id=self.trace.trace_id,
            )
            runtime = await get_runtime()
            body = await read_body(self.receive, MAX_BODY_BYTES)
            if self.key is None:
                auth = header(self.scope, b"authorization")
                key = self.key = await authenticate(runtime.keys, auth)
                nonce = check_signature(key, self.scope, body)
            else:
                # A signed-in user proved who they are; signatures prove a client holds the
                # key's secrets, which the portal never has.
                key = self.key
                check_usable(key, time.time())
                nonce = None
            check_network(key, client_address(self.scope, runtime.trusted_proxies))
            self.clock.mark(Stage.AUTH)
            prepare = functools.partial(self._prepare, runtime, key, body)
            if len(body) > settings.DMX_LARGE_BODY_BYTES:
                try:
                    async with asyncio.timeout(self._time_left()):
                        model, preferred = await runtime.off_loop(prepare, owner=key.id)
                except TimeoutError:
                    raise self._timed_out() from None
            else:
                model, preferred = prepare()
            request = self.request
            await self._admit(runtime, key, model, request, nonce)
            self.route_request = RouteRequest(
                request_id=self.request_id,
                model=model,
                prompt_tokens=self.estimated_tokens or 0,
                completion_tokens=request.max_tokens or 0,
                priority=key.priority,
                affinity=affinity_key(request),
                preferred_profiles=preferred,
            )
            route = functools.partial(self._route, runtime)
            self.sent_at = time.time()
            async with connect(
                runtime,
                request,
                route,
                priority=key.priority,
                time_left=self._time_left,
                request_id=self.request_id,
                trace=self.trace,
            ) as (node, response):
                self.node = node
                self.others_on_node = runtime.fleet.others_on(node, since=self.sent_at)
                self.clock.mark(Stage.CONNECT)
                if response.status != 200:  # a 4xx: the request's fault, not the node's
                    raise upstream_error(response.status, await response.read())
                if request.stream:
                    await self._stream(runtime, response)
                else:
                    await self._respond(runtime, response)
            await self._observe(runtime)
        except ApplicationError as error:
            await self._fail(runtime, error)
        except UpstreamTimeout:
            await self._fail(runtime, self._timed_out())
        except UpstreamConnectionError as exc:
            await self._fail(
                runtime,
                UpstreamError(
                    f"The model server failed: {exc}", code=GatewayErrorCode.UPSTREAM_ERROR
                ),
            )
        except RedisUnavailable:
            await self._fail(
                runtime,
                ServiceUnavailableError(
                    "The gateway cannot reach its state store. Please retry shortly.",
                    code=GatewayErrorCode.STATE_UNAVAILABLE,
                    headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
                ),
            )
        except Exception:
            logger.exception("request %s failed", self.request_id)
            await self._fail(
                runtime, ApplicationError("The server had an error while processing your request.")
            )
        finally:
            await self._confirm_settlement(runtime)
            self.trace.end(self)
            self._export_metrics()

    def _export_metrics(self) -> None:
        streamed = bool(self.request and self.request.stream)
        elapsed = time.perf_counter() - self._t0
        _REQUEST_DURATION(
            self.endpoint.value, str(self.http_status), "true" if streamed else "false"
        ).observe(elapsed)
        for stage, ms in self.clock.timings.items():
            histogram = _STAGE_HISTOGRAMS.get(stage)
            if histogram is not None:
                histogram.observe(ms / 1000)
        if streamed and self.node is not None and self.first_token_at is not None:
            model = self.node.model
            _TIME_TO_FIRST_TOKEN(model).observe(self.first_token_at - self._t0)
            if self.outcome is UsageStatus.OK:
                _STREAM_DURATION(model).observe(elapsed)

    async def _route(self, runtime: GatewayRuntime, tried: list[int]) -> NodeSnapshot | None:
        """Decide a node; when the model is saturated, wait for room in the priority queue."""
        request = self.route_request
        model, priority = request.model.name, request.priority
        if tried:
            self.clock.mark(Stage.CONNECT)  # the try that failed
        exclude = list(tried)
        deadline = time.monotonic() + settings.DMX_ADMISSION_TIMEOUT_SECONDS
        waited_from = time.monotonic()
        # Someone of this tier or higher waits already: take a place behind them.
        must_wait = runtime.queues.ahead_of(model, priority)
        while True:
            if not must_wait:
                decision = self.decision = runtime.router.decide(request, exclude=exclude)
                _ROUTING_DECISION.observe(decision.decision_us / 1_000_000)
                node = decision.node
                if node is not None:
                    if runtime.breakers.state(node.id) is BreakerState.HALF_OPEN and not (
                        await runtime.breakers.try_probe(node.id)
                    ):
                        exclude.append(node.id)  # another request is this node's probe
                        continue
                    self.clock.mark(Stage.ROUTE)
                    self.waited_ms += (time.monotonic() - waited_from) * 1000
                    self.node = node
                    return node
                self.clock.mark(Stage.ROUTE)
                if not decision.saturated:
                    return None
            must_wait = False
            remaining = deadline - time.monotonic()
            try:
                woken = remaining > 0 and await runtime.queues.wait(model, priority, remaining)
            except QueueFull:
                woken = False
            self.clock.mark(Stage.QUEUE)
            self.waited_ms += (time.monotonic() - waited_from) * 1000
            waited_from = time.monotonic()
            if not woken:
                self.queue_timeout = True
                metrics.gateway_refusals.labels("queue_timeout").inc()
                raise ServiceUnavailableError(
                    f"Model `{model}` is at capacity and no node freed up in time. "
                    "Please retry shortly.",
                    code=GatewayErrorCode.NO_CAPACITY,
                    headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
                )

    async def _observe(self, runtime: GatewayRuntime) -> None:
        """Tell the node's latency window and breaker how this request went."""
        if self.node is None:
            return
        ttft = (self.first_token_at - self._t0) * 1000 if self.first_token_at else None
        await runtime.observe(
            self.node,
            failed=self.outcome is UsageStatus.UPSTREAM_ERROR,
            ttft_ms=ttft if self.request and self.request.stream else None,
            latency_ms=(time.perf_counter() - self._t0) * 1000,
            model=self.route_request.model,
            prompt_tokens=self.route_request.prompt_tokens,
            others_on_node=self.others_on_node,
        )

    def _prepare(
        self, runtime: GatewayRuntime, key: KeyRecord, body: bytes
    ) -> tuple[ModelEntry, frozenset[str]]:
        """Parse, classify, resolve the model, screen the prompt and count it against the
        context allowed now; return the model and its preferred hardware.

        CPU only, in proportion to the body: the caller runs it in the runtime's worker thread
        when the body is large, so that a prompt of megabytes does not hold the event loop."""
        request = self.request = validate_completion(self.endpoint, parse_json(body))
        self.clock.mark(Stage.PARSE)
        self.intent = classify(intent_text(request)).label
        self.clock.mark(Stage.INTENT)
        model, preferred = resolve_model(runtime, key, request.model, self.intent, self.request_id)
        limit = self.context_limit = context_limit(model, runtime.fleet)
        check_context_bound(model, request, limit)
        self.flags = screen_prompt(runtime.content_filter, request)
        self.clock.mark(Stage.SCREEN)
        tokens = self.estimated_tokens = prompt_tokens(model, request)
        check_context(model, request, tokens, limit)
        self.clock.mark(Stage.CONTEXT)
        return model, preferred

    async def _admit(
        self,
        runtime: GatewayRuntime,
        key: KeyRecord,
        model: ModelEntry,
        request: CompletionRequest,
        nonce: str | None,
    ) -> None:
        """Reserve the prompt and the completion it may take against the key's limits."""
        tokens = self.estimated_tokens
        if tokens is None:
            tokens = len(intent_text(request)) // CHARS_PER_TOKEN + 1
        self.reserved = reservation(request, tokens, self.context_limit)
        self.admission = await admit(
            runtime.limiter,
            request_id=self.request_id,
            key=key,
            model=model.name,
            reserve=self.reserved,
            nonce=nonce,
        )
        self.headers += self.admission.headers()
        self.clock.mark(Stage.LIMITS)

    async def _fail(self, runtime: GatewayRuntime | None, error: ApplicationError) -> None:
        self.http_status = error.status
        self.error_code = str(error.code)
        if self.outcome is UsageStatus.OK:
            self.outcome = (
                UsageStatus.UPSTREAM_ERROR
                if isinstance(error, UpstreamError)
                else UsageStatus.REJECTED
            )
        await self._settle(runtime)
        if self.response_started:
            if runtime is not None and isinstance(error, UpstreamError):
                await runtime.observe(self.node, failed=True)
            # Mid-stream: the status line is gone; tell the client in the stream, as OpenAI does.
            await self._send_body(sse.encode(error.to_json()), more=False)
            return
        await send_error(self.send, error, self.headers)

    def _time_left(self) -> float:
        return self._t0 + settings.DMX_REQUEST_TIMEOUT_SECONDS - time.perf_counter()

    def _timed_out(self) -> GatewayTimeoutError:
        self.outcome = UsageStatus.TIMED_OUT
        return GatewayTimeoutError(
            f"The request ran longer than {settings.DMX_REQUEST_TIMEOUT_SECONDS:g} seconds."
        )

    async def _respond(self, runtime: GatewayRuntime, response: UpstreamResponse) -> None:
        try:
            async with asyncio.timeout(self._time_left()):
                data = await response.read()
        except TimeoutError:
            raise self._timed_out() from None
        self.first_token_at = self.clock.mark(Stage.GENERATE)
        data, self.usage, flags, blocked = filter_response(
            data, runtime.content_filter, endpoint=self.endpoint
        )
        self.flags = sorted({*self.flags, *flags})
        if blocked:
            self.outcome = UsageStatus.CONTENT_FILTERED
        await self._submit_settlement(runtime)
        await send_json(self.send, 200, data, self.headers)

    async def _stream(self, runtime: GatewayRuntime, response: UpstreamResponse) -> None:
        relay = asyncio.ensure_future(self._relay(runtime, response))
        disconnect = asyncio.ensure_future(self._wait_disconnect())
        done, _ = await asyncio.wait(
            (relay, disconnect), timeout=self._time_left(), return_when=asyncio.FIRST_COMPLETED
        )
        if relay in done:
            disconnect.cancel()
            relay.result()
            return
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        if not done:  # the request's time is up: end the stream, bill what was generated
            disconnect.cancel()
            raise self._timed_out()
        # The client left: charge what was generated; closing the response aborts vLLM's work.
        self.outcome = UsageStatus.CLIENT_DISCONNECTED
        self.http_status = 499  # nginx's "client closed request"
        await self._settle(runtime)

    async def _wait_disconnect(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _relay(self, runtime: GatewayRuntime, response: UpstreamResponse) -> None:
        editor = self.editor = StreamEditor(
            runtime.content_filter, endpoint=self.endpoint, include_usage=self.request.include_usage
        )
        splitter = sse.EventSplitter()
        # vLLM's first event (the role chunk) waits for the next one: should the engine refuse
        # the request instead, the client then gets the refusal's own status, as unstreamed.
        # Only that one: a stream of tool calls or reasoning has no content for a long while.
        held: list[bytes] = []
        events = 0
        async for chunk in response.chunks():
            for event in splitter.feed(chunk):
                data = sse.data_of(event)
                if data is None:
                    continue
                if data == sse.DONE:
                    self.clock.mark(Stage.DECODE)
                    await self._submit_settlement(runtime)
                    held.append(sse.encode(sse.DONE))
                    continue
                if data.startswith(b'{"error"'):
                    held.append(await self._stream_error(runtime, stream_error(data)))
                    continue
                events += 1
                edited = editor.edit(data)
                if editor.first_content and self.first_token_at is None:
                    self.first_token_at = self.clock.mark(Stage.TTFT)
                    self.others_on_node = max(
                        self.others_on_node,
                        runtime.fleet.others_on(self.node, since=self.sent_at),
                    )
                if edited is not None:
                    held.append(sse.encode(edited))
                if editor.blocked is not None:
                    await self._end_blocked(runtime, held)
                    return
            if held and (self.response_started or events > 1 or self.settled):
                await self._send_body(b"".join(held), more=True)
                held = []
        if not self.settled:
            # The node closed the stream without [DONE]: it failed mid-generation.
            metrics.gateway_upstream_errors.labels("stream").inc()
            raise UpstreamError(
                "The model server ended the stream early.", code=GatewayErrorCode.UPSTREAM_ERROR
            )
        await self._send_body(b"".join(held), more=False)

    async def _stream_error(self, runtime: GatewayRuntime, error: ApplicationError) -> bytes:
        """An error the engine sent in the stream. Before any token: raised, to be answered with
        its status. After: the event in OpenAI's shape. A refusal of the request (4xx) is the
        client's, and no failure of the node's: only the others count against its breaker."""
        failed = isinstance(error, UpstreamError)
        if failed:
            metrics.gateway_upstream_errors.labels("stream").inc()
        if not self.response_started:
            if failed:
                await runtime.observe(self.node, failed=True)
            raise error
        self.outcome = UsageStatus.UPSTREAM_ERROR if failed else UsageStatus.REJECTED
        self.error_code = str(error.code)
        return sse.encode(error.to_json())

    async def _start_stream(self) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", EVENT_STREAM),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # proxies must not hold events back
                    *self.headers,
                ],
            }
        )
        self.response_started = True

    async def _end_blocked(self, runtime: GatewayRuntime, out: list[bytes]) -> None:
        """The output hit a blocked term: finish the stream here, bill what was generated."""
        self.outcome = UsageStatus.CONTENT_FILTERED
        self.clock.mark(Stage.DECODE)
        await self._settle(runtime)
        if self.request.include_usage and self.editor.usage:
            out.append(sse.encode(self.editor.usage_chunk()))
        out.append(sse.encode(sse.DONE))
        await self._send_body(b"".join(out), more=False)

    async def _send_body(self, body: bytes, *, more: bool) -> None:
        if not self.response_started:
            await self._start_stream()
        await self.send({"type": "http.response.body", "body": body, "more_body": more})

    def _usage_event(self, prompt: int, completion: int) -> UsageEvent:
        node = self.node
        if self.route_request is not None:
            model = self.route_request.model.name
        else:  # as the client asked: anything a JSON string holds
            model = storable_text(self.request.model, MODEL_CHARS) if self.request else ""
        return UsageEvent(
            request_id=self.request_id,
            api_key_id=self.key.id,
            tenant_id=self.key.tenant_id,
            created_at=self.received_at,
            endpoint=self.endpoint.value,
            model=model,
            model_version=node.version_tag if node else "",
            node=node.name if node else "",
            intent=self.intent,
            stream=bool(self.request and self.request.stream),
            status=self.outcome.value,
            http_status=self.http_status,
            error_code=self.error_code,
            prompt_tokens=prompt,
            completion_tokens=completion,
            duration_ms=round((time.perf_counter() - self._t0) * 1000, 3),
            time_to_first_token_ms=(
                round((self.first_token_at - self._t0) * 1000, 3) if self.first_token_at else None
            ),
            estimated_prompt_tokens=self.estimated_tokens,
            context_limit=self.context_limit,
            content_flags=sorted({*self.flags, *(self.editor.flags() if self.editor else ())}),
            timings=self.clock.timings,
            client_request_id=self.client_request_id,
            trace_id=self.trace.trace_id,
        )

    def _decision_event(self, runtime: GatewayRuntime) -> DecisionEvent | None:
        """The routing decision for the log: always when it found no node, else if sampled."""
        decision = self.decision
        if decision is None or (decision.node is not None and not runtime.decision_sampler.keep()):
            return None
        if self.queue_timeout:
            outcome = DecisionOutcome.QUEUE_TIMEOUT
        else:
            outcome = DecisionOutcome.ROUTED if decision.node else DecisionOutcome.NO_CAPACITY
        return decision_event(
            decision,
            request_id=self.request_id,
            created_at=self.received_at,
            requested_model=self.request.model,
            model=self.route_request.model.name,
            intent=self.intent,
            priority=self.route_request.priority,
            outcome=outcome,
            waited_ms=self.waited_ms,
        )

    async def _settle(self, runtime: GatewayRuntime | None) -> None:
        """Settle and wait for Redis's answer (where nothing is left to send the client)."""
        await self._submit_settlement(runtime)
        await self._confirm_settlement(runtime)

    async def _submit_settlement(self, runtime: GatewayRuntime | None) -> None:
        """Refund the reservation's excess and append the usage record; once per request.

        Returns once the call is in the kernel's socket to Redis (RespClient.submit): the
        response's last bytes are sent after it, so no crash of this process can lose the
        record of a response a client got, and Redis's answer is awaited after the response
        (_confirm_settlement) instead of holding it back a round trip."""
        if self.settled or self.key is None or runtime is None:
            return
        self.settled = True
        if Stage.DECODE in self.clock.timings or Stage.GENERATE in self.clock.timings:
            self.clock.mark(Stage.SETTLE)
        usage = (self.editor.usage if self.editor else None) or self.usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        event = self._usage_event(prompt, completion)
        encoded = event.encode()
        events = [(USAGE_STREAM.key(), encoded)]
        decision = self._decision_event(runtime)
        if decision is not None:
            events.append((DECISION_STREAM.key(), decision.encode()))
        # A task of its own, so that the relay cancelled meanwhile (the client left, the time ran
        # out) cannot cancel the call halfway and drop the record: _confirm_settlement, which
        # every request ends with, waits for it.
        submitted = asyncio.ensure_future(
            runtime.limiter.submit_settle(
                self.admission, refund=self.reserved - prompt - completion, events=events
            )
        )
        self._settlement = (submitted, events)
        with contextlib.suppress(Exception):  # what failed, _confirm_settlement sees
            await asyncio.shield(submitted)
        if prompt or completion:
            tier = _TIER_LABELS.get(self.key.priority, "standard")
            _TOKENS(event.model, "prompt", tier).inc(prompt)
            _TOKENS(event.model, "completion", tier).inc(completion)

    async def _confirm_settlement(self, runtime: GatewayRuntime | None) -> None:
        """Wait for the settle call and Redis's answer to it, if one is on its way."""
        if self._settlement is None:
            return
        submitted, events = self._settlement
        self._settlement = None
        try:
            await (await submitted)
        except BaseException as exc:
            # Maybe appended, maybe not: a replay of one that was is stored once.
            _keep(runtime, self.request_id, events)
            if not isinstance(exc, Exception):
                raise  # cancelled: the record is kept, the cancellation goes on


# Children bound once (metrics.Bound): label lookups are what the request path can do without.
_STAGE_HISTOGRAMS = {
    stage.value: metrics.gateway_stage_seconds.labels(stage.value) for stage in GATEWAY_STAGES
}
_TIER_LABELS = {tier.value: tier.name.lower() for tier in PriorityTier}
_ROUTING_DECISION = metrics.routing_decision_seconds
_REQUEST_DURATION = metrics.Bound(metrics.gateway_request_duration)
_TIME_TO_FIRST_TOKEN = metrics.Bound(metrics.gateway_time_to_first_token)
_STREAM_DURATION = metrics.Bound(metrics.gateway_stream_duration)
_TOKENS = metrics.Bound(metrics.gateway_tokens)


def _keep(runtime: GatewayRuntime, request_id: str, events: list[tuple[str, bytes]]) -> None:
    """Redis did not take the request's stream entries: spool them for the runtime to replay;
    should the disk refuse too, log the usage record whole, for `manage.py usage_replay`."""
    try:
        runtime.spool.append(events)
    except OSError as exc:
        for key, payload in events:
            if key == USAGE_STREAM.key():
                logger.error("%s %s", UNRECORDED, payload.decode())
        logger.error("request %s: stream entries neither in Redis nor spooled: %s", request_id, exc)
    else:
        logger.warning("request %s: Redis did not take its usage record; spooled", request_id)
