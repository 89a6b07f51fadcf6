"""One request to a model through the gateway, stage by stage, over one CompletionState.

auth (KeyGate: key, signature, client network) -> parse (the client's API, into the
engine's: apps.gateway.dialects) -> intent -> resolve the model
(routing: aliases by intent) -> screen the prompt -> count its tokens against the context
allowed now -> limits (KeyGate: one Redis round trip, or none from the process's lease) ->
route, connect and answer (apps.gateway.relay; routing holds the node) -> settle
(apps.gateway.settlement: one Redis call refunds, frees the slot and appends usage).

Each stage is timed; the timings go into the usage record with the request id. A request is
billed exactly: prompt and completion tokens as vLLM counted them, nothing for a node that failed
before the first token, what was generated when a client leaves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings

from apps.gateway.background import BackgroundReply, detach
from apps.gateway.charges import reservation_rates, worst_case
from apps.gateway.context import (
    check_context,
    check_context_bound,
    count_prompt,
    estimate_prompt,
    reservation,
)
from apps.gateway.dialects.responses import continue_from
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.intent import LABELS, classify
from apps.gateway.prompts import intent_text, screen_prompt
from apps.gateway.relay import forward
from apps.gateway.request_ids import accept_client_request_id
from apps.gateway.runtime import GatewayRuntime, get_runtime
from apps.gateway.schemas import Endpoint, parse_json
from apps.gateway.settlement import usage_record
from apps.gateway.state import CompletionState, reached
from apps.keys.choices import PriorityTier
from apps.keys.gate import KeyRecord, UsageStatus
from apps.models.catalog import ModelEntry
from apps.models.choices import ModelKind
from apps.routing.dispatcher import Resolution
from dmxplatform import metrics
from dmxplatform.clients import client_address
from dmxplatform.errors import ApplicationError, InvalidRequestError, NotFoundError
from dmxplatform.logs import bind_request
from dmxplatform.responses import dumps, read_body
from dmxplatform.stages import GATEWAY_STAGES, Stage

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Request bodies above this are refused before parsing: 8 MiB holds any prompt a 1M-token
# context accepts, and stops a client from making the gateway buffer arbitrary amounts.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Without a tokenizer for the model, a prompt's tokens are estimated from its length.
CHARS_PER_TOKEN = 4


async def complete(state: CompletionState) -> None:
    """Run the request to its end: answered, usage recorded, metrics and trace written.

    Two holds end with it, each once, however it ends: the key's lease (settled as its block
    ends, Lease) and the node routing gave it (reported as Dispatch.connect's block ends, in
    forward). What is left here is answering the client with the error that ended it.

    A background response (apps.gateway.background) is answered once admitted, and its run
    goes on here, its client the run's Redis stream."""
    background: BackgroundReply | None = None
    try:
        state.client_request_id = accept_client_request_id(state.scope, state.reply.headers)
        bind_request(
            state.request_id,
            client_request_id=state.client_request_id,
            trace_id=state.trace.trace_id,
        )
        runtime = await get_runtime()
        body = await read_body(state.receive, MAX_BODY_BYTES)
        key = await authenticate(state, runtime, body)
        lease = state.lease = runtime.gate.lease(
            key,
            request_id=state.request_id,
            usage=functools.partial(usage_record, state),
            once=bool(state.batch_id),  # a lost batch worker's line runs again under its id
        )
        async with lease:
            await prepare_off_loop(state, runtime, body)
            await admit(state, runtime)
            if state.background:
                background = await detach(state, runtime)
            await forward(state, runtime)
    except BaseException as ended_by:
        error = state.end(ended_by)
        if error is not None:
            # Mid-stream the status line is gone: the error goes in the stream, as the API
            # sends it.
            await state.reply.error(error, event=state.writer.error(error) if state.writer else b"")
        if not isinstance(ended_by, Exception):
            raise
    finally:
        if background is not None:
            await asyncio.shield(background.finish(state.kept, state.kept_payload))
        elif not state.reply.finished and state.outcome is not UsageStatus.CLIENT_DISCONNECTED:
            _unanswered(state)
        state.trace.end(state)
        _export_metrics(state)


# What token counting sets over the body it counts, and the object it answers with, by API.
# Counting takes no token budget (neither endpoint has one); the create call's parser may
# require one, and the context check adds it to the prompt: the least there is. A count stores
# nothing and runs nothing in the background.
COUNTING: dict[Endpoint, tuple[dict[str, Any], dict[str, Any]]] = {
    Endpoint.MESSAGES: ({"max_tokens": 1}, {}),
    Endpoint.RESPONSES: (
        {"max_output_tokens": 1, "store": False, "background": False, "stream": False},
        {"object": "response.input_tokens"},
    ),
}


async def count_tokens(state: CompletionState) -> None:
    """POST /v1/messages/count_tokens (Anthropic's) and /v1/responses/input_tokens (OpenAI's):
    the prompt's tokens, counted as the same request to create a message or response counts
    them (its model resolved, a stored conversation it continues included, screened, its
    template rendered with the model's tokenizer), so the figure is what that request's prompt
    is held and billed at. No limits, no engine, no usage record: counting is free, as the
    vendors' is."""
    overrides, answer = COUNTING[state.endpoint]
    try:
        runtime = await get_runtime()
        body = await read_body(state.receive, MAX_BODY_BYTES)
        await authenticate(state, runtime, body)
        await prepare_off_loop(state, runtime, body, overrides=overrides)
        count = state.prompt_count
        if count is None or count.tokens is None:
            count = estimate_prompt(reached(state.request, "parse"), CHARS_PER_TOKEN)
        await state.reply.json(200, dumps({**answer, "input_tokens": count.tokens}))
    except ApplicationError as error:
        await state.reply.error(error)
    finally:
        state.trace.end(state)


_UNANSWERED = metrics.gateway_connections_closed.labels("unanswered")


def _unanswered(state: CompletionState) -> None:
    """The request ends without a complete response while its client waits: uvicorn then
    closes the connection (or sends a bare 500), so say which request and why."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        reason = "cancelled: the server stopped past its grace period"
    else:
        reason = "the request ended without an answer"
    logger.error("request %s closed without a complete response: %s", state.request_id, reason)
    _UNANSWERED.inc()


async def authenticate(state: CompletionState, runtime: GatewayRuntime, body: bytes) -> KeyRecord:
    key, state.nonce = await runtime.gate.authenticate(
        state.scope,
        body,
        address=client_address(state.scope, runtime.trusted_proxies),
        acting_for=state.key,
    )
    state.key = key
    state.clock.mark(Stage.AUTH)
    return key


async def prepare_off_loop(
    state: CompletionState,
    runtime: GatewayRuntime,
    body: bytes,
    *,
    overrides: dict[str, Any] | None = None,
) -> None:
    """Parse the body and prepare() the request, both in the runtime's worker thread when the
    body is large; a turn that continues a stored response gets its conversation between the
    two. `overrides`: fields set over the body's (token counting's)."""
    size = len(body)
    data = await _cpu(state, runtime, size, functools.partial(parse_json, body))
    if overrides:
        data.update(overrides)
    if state.endpoint is Endpoint.RESPONSES and data.get("previous_response_id") is not None:
        size += await _continue(state, runtime, data)
    await _cpu(state, runtime, size, functools.partial(prepare, state, runtime, data))


async def _cpu(
    state: CompletionState, runtime: GatewayRuntime, size: int, work: Callable[[], T]
) -> T:
    """Run CPU work in proportion to a prompt of `size` bytes: in the runtime's worker thread
    when it is large, so that a prompt of megabytes does not hold the event loop."""
    if size <= settings.DMX_LARGE_BODY_BYTES:
        return work()
    try:
        async with asyncio.timeout(state.time_left()):
            return await runtime.off_loop(work, owner=reached(state.key, "auth").id)
    except TimeoutError:
        raise state.timed_out() from None


async def _continue(state: CompletionState, runtime: GatewayRuntime, data: dict[str, Any]) -> int:
    """previous_response_id: the stored conversation (every item in and out) goes before the
    request's input, to be screened, counted, routed (its cached prefix draws the request to
    the node that has it) and billed as any prompt. Returns its stored size: a short body may
    continue a conversation of megabytes, which is prepared off the loop as a large body is."""
    tenant = reached(state.key, "auth").tenant_id
    record, size = await runtime.responses.history(data["previous_response_id"], tenant)
    continue_from(data, record.history())
    return size


def prepare(state: CompletionState, runtime: GatewayRuntime, data: dict[str, Any]) -> None:
    """Parse, classify, resolve the model, screen the prompt and count it against the context
    allowed now. CPU only, in proportion to the body (prepare_off_loop)."""
    request = state.request = state.dialect.parse(data)
    state.clock.mark(Stage.PARSE)
    resolution = _resolve(state, runtime, request)
    model = state.model = resolution.model
    limit = state.context_limit = resolution.context_limit
    state.preferred = resolution.preferred
    # A batch's requests run below every interactive tier, on capacity nobody else uses.
    state.priority = (
        PriorityTier.BATCH
        if state.batch_id
        else resolution.priority(reached(state.key, "auth").priority)
    )
    _check_kind(model, request.endpoint)
    check_context_bound(model, request, limit)
    state.flags = screen_prompt(runtime.content_filter, request)
    state.clock.mark(Stage.SCREEN)
    counted = state.prompt_count = count_prompt(model, request)
    tokens = state.estimated_tokens = counted.tokens
    check_context(model, request, tokens, limit)
    state.clock.mark(Stage.CONTEXT)


def _resolve(state: CompletionState, runtime: GatewayRuntime, request) -> Resolution:
    """The model the request goes to: an alias resolved by the prompt's intent (embeddings
    name their model: no intent is read)."""
    resolve = functools.partial(
        runtime.dispatcher.resolve,
        request.model,
        request_id=state.request_id,
        allows=reached(state.key, "auth").allows,
    )
    if request.endpoint is Endpoint.EMBEDDINGS:
        return resolve(intent="")
    prediction = classify(intent_text(request))
    state.intent = prediction.label
    state.intent_confidence = prediction.confidence
    state.clock.mark(Stage.INTENT)
    # A label the classifier is unsure of routes by the alias's default ("") route; an alias
    # without one still routes by the label, the best guess there is.
    sure = prediction.confidence >= settings.DMX_INTENT_MIN_CONFIDENCE
    state.intent_low_confidence = not sure
    metrics.gateway_intents.labels(state.intent, "ok" if sure else "low").inc()
    try:
        return resolve(intent=state.intent if sure else "")
    except NotFoundError:
        if sure:
            raise
        return resolve(intent=state.intent)


def _check_kind(model: ModelEntry, endpoint: Endpoint) -> None:
    """Embeddings go to embedding models only, everything else to generating ones."""
    wanted = ModelKind.EMBED if endpoint is Endpoint.EMBEDDINGS else ModelKind.GENERATE
    if model.kind != wanted:
        kind = "an embedding" if model.kind == ModelKind.EMBED else "a text generation"
        raise InvalidRequestError(
            f"The model `{model.name}` is {kind} model: it does not serve {endpoint.path}.",
            param="model",
            code=GatewayErrorCode.UNSUPPORTED_MODEL,
        )


async def admit(state: CompletionState, runtime: GatewayRuntime) -> None:
    """Reserve the prompt and the completion it may take, and what they may cost, against the
    key's limits and budgets and the tenant's prepaid balance."""
    request, count = reached(state.request, "parse"), state.prompt_count
    if count is None or count.tokens is None:
        count = estimate_prompt(request, CHARS_PER_TOKEN)
    model, limit = reached(state.model, "resolve"), reached(state.context_limit, "resolve")
    # The price book as the request found it: its cost is settled at these prices.
    state.prices = runtime.prices
    rates = state.rates = reservation_rates(state.prices, model, state.received_at)
    multiplier = reached(state.key, "auth").price_multiplier
    admission = await reached(state.lease, "limits").admit(
        model=model.name,
        reserve=reservation(request, count, limit),
        money=worst_case(request, count, limit, rates, multiplier, batch=bool(state.batch_id)),
        nonce=state.nonce,
    )
    state.reply.headers += admission.headers()
    state.clock.mark(Stage.LIMITS)


# Children bound once (metrics.Bound): label lookups are what the request path can do without.
_STAGE_HISTOGRAMS = {
    stage.value: metrics.gateway_stage_seconds.labels(stage.value) for stage in GATEWAY_STAGES
}
_REQUEST_DURATION = metrics.Bound(metrics.gateway_request_duration)
_TIME_TO_FIRST_TOKEN = metrics.Bound(metrics.gateway_time_to_first_token)
_STREAM_DURATION = metrics.Bound(metrics.gateway_stream_duration)
# Every intent's, from the start: a dashboard's quantile over an intent not seen yet is empty,
# not missing.
_INTENT_TTFT = {label: metrics.gateway_intent_time_to_first_token.labels(label) for label in LABELS}
_INTENT_DURATION = {
    label: metrics.gateway_intent_request_duration.labels(label) for label in LABELS
}


def _export_metrics(state: CompletionState) -> None:
    streamed = bool(state.request and state.request.stream)
    elapsed = time.perf_counter() - state.started
    _REQUEST_DURATION(
        state.endpoint.value, str(state.http_status), "true" if streamed else "false"
    ).observe(elapsed)
    for stage, ms in state.clock.timings.items():
        histogram = _STAGE_HISTOGRAMS.get(stage)
        if histogram is not None:
            histogram.observe(ms / 1000)
    node = state.node
    if streamed and node is not None and state.first_token_at is not None:
        _TIME_TO_FIRST_TOKEN(node.model).observe(state.first_token_at - state.started)
        if state.outcome is UsageStatus.OK:
            _STREAM_DURATION(node.model).observe(elapsed)
    # Embeddings have no intent; a request that failed says nothing of how long its kind takes.
    if state.intent and state.outcome is UsageStatus.OK:
        _INTENT_DURATION[state.intent].observe(elapsed)
        if streamed and state.first_token_at is not None:
            _INTENT_TTFT[state.intent].observe(state.first_token_at - state.started)
