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

from django.conf import settings

from apps.gateway.context import (
    check_context,
    check_context_bound,
    context_limit,
    count_prompt,
    estimate_prompt,
    reservation,
)
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.intent import classify
from apps.gateway.prompts import intent_text, prefix_blocks, screen_prompt
from apps.gateway.relay import forward
from apps.gateway.request_ids import accept_client_request_id
from apps.gateway.runtime import GatewayRuntime, get_runtime
from apps.gateway.schemas import Endpoint, parse_json
from apps.gateway.settlement import confirm, settle
from apps.gateway.state import CompletionState
from apps.gateway.upstream_http import UpstreamTimeout
from apps.keys.gate import UsageStatus
from apps.models.catalog import ModelEntry
from apps.models.choices import ModelKind
from apps.routing.dispatcher import NodeFailed
from dmxplatform import metrics
from dmxplatform.clients import client_address
from dmxplatform.errors import (
    ApplicationError,
    GatewayTimeoutError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
    UpstreamError,
    UpstreamUnavailableError,
)
from dmxplatform.logs import bind_request
from dmxplatform.resp import RedisUnavailable
from dmxplatform.responses import read_body
from dmxplatform.stages import GATEWAY_STAGES, Stage
from inference.prefix_cache import chain_hashes

logger = logging.getLogger(__name__)

# Request bodies above this are refused before parsing: 8 MiB holds any prompt a 1M-token
# context accepts, and stops a client from making the gateway buffer arbitrary amounts.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Without a tokenizer for the model, a prompt's tokens are estimated from its length.
CHARS_PER_TOKEN = 4


async def complete(state: CompletionState) -> None:
    """Run the request to its end: answered, usage recorded, metrics and trace written."""
    runtime: GatewayRuntime | None = None
    try:
        state.client_request_id = accept_client_request_id(state.scope, state.reply.headers)
        bind_request(
            state.request_id,
            client_request_id=state.client_request_id,
            trace_id=state.trace.trace_id,
        )
        runtime = await get_runtime()
        body = await read_body(state.receive, MAX_BODY_BYTES)
        await authenticate(state, runtime, body)
        if len(body) > settings.DMX_LARGE_BODY_BYTES:
            try:
                async with asyncio.timeout(state.time_left()):
                    await runtime.off_loop(
                        functools.partial(prepare, state, runtime, body), owner=state.key.id
                    )
            except TimeoutError:
                raise state.timed_out() from None
        else:
            prepare(state, runtime, body)
        await admit(state, runtime)
        await forward(state, runtime)
    except ApplicationError as error:
        await fail(state, runtime, error)
    except UpstreamTimeout:
        await fail(state, runtime, state.timed_out())
    except NodeFailed as failed:  # mid-answer: routing counted it, the client keeps what it had
        await fail(state, runtime, failed.error)
    except RedisUnavailable:
        await fail(
            state,
            runtime,
            ServiceUnavailableError(
                "The gateway cannot reach its state store. Please retry shortly.",
                code=GatewayErrorCode.STATE_UNAVAILABLE,
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            ),
        )
    except Exception:
        logger.exception("request %s failed", state.request_id)
        await fail(
            state,
            runtime,
            ApplicationError("The server had an error while processing your request."),
        )
    finally:
        await confirm(state)
        if not state.reply.finished and state.outcome is not UsageStatus.CLIENT_DISCONNECTED:
            _unanswered(state)
        state.trace.end(state)
        _export_metrics(state)


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


async def authenticate(state: CompletionState, runtime: GatewayRuntime, body: bytes) -> None:
    state.key, state.nonce = await runtime.gate.authenticate(
        state.scope,
        body,
        address=client_address(state.scope, runtime.trusted_proxies),
        acting_for=state.key,
    )
    state.clock.mark(Stage.AUTH)


def prepare(state: CompletionState, runtime: GatewayRuntime, body: bytes) -> None:
    """Parse, classify, resolve the model, screen the prompt and count it against the context
    allowed now.

    CPU only, in proportion to the body: run in the runtime's worker thread when the body is
    large, so that a prompt of megabytes does not hold the event loop."""
    request = state.request = state.dialect.parse(parse_json(body))
    state.clock.mark(Stage.PARSE)
    model = state.model = _resolve(state, runtime, request)
    _check_kind(model, request.endpoint)
    limit = state.context_limit = context_limit(model, runtime.dispatcher.kv_pressure(model.name))
    check_context_bound(model, request, limit)
    state.flags = screen_prompt(runtime.content_filter, request)
    state.clock.mark(Stage.SCREEN)
    counted = state.prompt_count = count_prompt(model, request)
    tokens = state.estimated_tokens = counted.tokens
    # Routing matches the prompt's prefix in token groups, as engines report what they cache;
    # without the model's tokenizer, in text blocks (this gateway's own routing index only).
    state.prefix_blocks = chain_hashes(counted.ids) if counted.ids else prefix_blocks(request)
    check_context(model, request, tokens, limit)
    state.clock.mark(Stage.CONTEXT)


def _resolve(state: CompletionState, runtime: GatewayRuntime, request) -> ModelEntry:
    """The model the request goes to: an alias resolved by the prompt's intent (embeddings
    name their model: no intent is read)."""
    resolve = functools.partial(
        runtime.dispatcher.resolve,
        request.model,
        request_id=state.request_id,
        allows=state.key.allows,
    )
    if request.endpoint is Endpoint.EMBEDDINGS:
        model, state.preferred = resolve(intent="")
        return model
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
        model, state.preferred = resolve(intent=state.intent if sure else "")
    except NotFoundError:
        if sure:
            raise
        model, state.preferred = resolve(intent=state.intent)
    return model


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
    """Reserve the prompt and the completion it may take against the key's limits."""
    request, count = state.request, state.prompt_count
    if count is None or count.tokens is None:
        count = estimate_prompt(request, CHARS_PER_TOKEN)
    state.reserved = reservation(request, count, state.context_limit)
    state.admission = await runtime.gate.admit(
        state.key,
        request_id=state.request_id,
        model=state.model.name,
        reserve=state.reserved,
        nonce=state.nonce,
    )
    state.reply.headers += state.admission.headers()
    state.clock.mark(Stage.LIMITS)


async def fail(
    state: CompletionState, runtime: GatewayRuntime | None, error: ApplicationError
) -> None:
    state.http_status = error.status
    state.error_code = str(error.code)
    if state.outcome is UsageStatus.OK:
        state.outcome = _outcome_of(error)
    await settle(state, runtime)
    # Mid-stream the status line is gone: the error goes in the stream, as the API sends it.
    await state.reply.error(error, event=state.writer.error(error) if state.writer else b"")


def _outcome_of(error: ApplicationError) -> UsageStatus:
    if isinstance(error, GatewayTimeoutError):
        return UsageStatus.TIMED_OUT
    if isinstance(error, UpstreamError | UpstreamUnavailableError):
        return UsageStatus.UPSTREAM_ERROR
    return UsageStatus.REJECTED


# Children bound once (metrics.Bound): label lookups are what the request path can do without.
_STAGE_HISTOGRAMS = {
    stage.value: metrics.gateway_stage_seconds.labels(stage.value) for stage in GATEWAY_STAGES
}
_REQUEST_DURATION = metrics.Bound(metrics.gateway_request_duration)
_TIME_TO_FIRST_TOKEN = metrics.Bound(metrics.gateway_time_to_first_token)
_STREAM_DURATION = metrics.Bound(metrics.gateway_stream_duration)


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
