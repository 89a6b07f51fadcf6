"""The route, connect and answer stages: routing picks and holds a node, the request goes to it,
and its answer comes back to the client through the output filter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

import orjson

from apps.gateway import sse
from apps.gateway.dialects.base import Answer
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.outputs import StreamEditor, embeddings_answer, filter_response, identity
from apps.gateway.prompts import affinity_key
from apps.gateway.reply import ClientLeft
from apps.gateway.runtime import GatewayRuntime
from apps.gateway.schemas import Endpoint
from apps.gateway.settlement import keep_response, response_record
from apps.gateway.state import CompletionState, reached
from apps.gateway.upstream import sender, stream_error, stream_failed, upstream_error
from apps.gateway.upstream_http import UpstreamConnectionError, UpstreamResponse
from apps.keys.gate import UsageStatus
from apps.routing.dispatcher import NodeFailed, RouteRequest
from dmxplatform.errors import ApplicationError, UpstreamError
from dmxplatform.resp import RedisUnavailable, RespError
from dmxplatform.responses import wait_disconnect
from dmxplatform.stages import Stage

logger = logging.getLogger(__name__)


async def forward(state: CompletionState, runtime: GatewayRuntime) -> None:
    """Send the request to the node routing picks (another one if it fails before answering),
    relay its answer, and tell routing how it went there. A stream's client is watched from the
    start: one that leaves while its request waits for a node or its first token stops it."""
    request = reached(state.request, "parse")
    priority = reached(state.priority, "resolve")
    prompt_ids = state.prompt_count.ids if state.prompt_count is not None else None
    state.dispatch = runtime.dispatcher.dispatch(
        RouteRequest(
            request_id=state.request_id,
            model=reached(state.model, "resolve"),
            prompt_tokens=state.estimated_tokens or 0,
            # The completion routing predicts from the ledger (apps.routing.work), capped by
            # max_tokens; billing reserved max_tokens whole.
            max_tokens=request.max_tokens,
            intent=state.intent,
            key_id=reached(state.key, "auth").id,
            priority=priority,
            affinity=affinity_key(request),
            preferred_profiles=state.preferred,
            prompt_ids=prompt_ids or (),
            prompt_param=request.param,
            streamed=request.stream,
            batch_line=bool(state.batch_id),
        ),
        state.clock,
        asked=request.model,
    )
    send = sender(
        reached(runtime.http, "start"),
        request,
        priority=priority,
        time_left=state.time_left,
        request_id=state.request_id,
        trace=state.trace,
        clock=state.clock,
    )
    if request.stream:
        await _while_the_client_waits(state, _exchange(state, runtime, send))
    else:
        await _exchange(state, runtime, send)


async def _exchange(state: CompletionState, runtime: GatewayRuntime, send) -> None:
    """Answer from the node routing holds; its exit tells routing how the node did."""
    async with reached(state.dispatch, "route").connect(send) as sent:
        with sent.answer as response:
            if response.status != 200:  # a 4xx: the request's fault, not the node's
                raise upstream_error(response.status, await response.read())
            try:
                if reached(state.request, "parse").stream:
                    await _relay(state, runtime, response)
                else:
                    await _respond(state, runtime, response)
            except UpstreamConnectionError as exc:  # the node died or went silent mid-answer
                raise NodeFailed(
                    UpstreamError(
                        f"The model server failed: {exc}", code=GatewayErrorCode.UPSTREAM_ERROR
                    )
                ) from exc


async def _respond(
    state: CompletionState, runtime: GatewayRuntime, response: UpstreamResponse
) -> None:
    try:
        async with asyncio.timeout(state.time_left()):
            data = await response.read()
    except TimeoutError:
        raise state.timed_out() from None
    state.first_token_at = state.clock.mark(Stage.GENERATE)
    request = reached(state.request, "parse")
    if request.endpoint is Endpoint.EMBEDDINGS:
        answer, state.usage = embeddings_answer(data, model=request.model)
    else:
        filtered = filter_response(
            data, runtime.content_filter, endpoint=request.endpoint, identity=_identity(state)
        )
        state.usage = filtered.usage
        state.flags = sorted({*state.flags, *filtered.flags})
        if filtered.blocked:
            state.outcome = UsageStatus.CONTENT_FILTERED
        answer = state.dialect.answer(filtered.response, _answer(state), filtered.stop_sequence)
    await _settle(state, runtime, answer)
    await state.reply.json(200, orjson.dumps(answer))


async def _settle(
    state: CompletionState, runtime: GatewayRuntime, response: dict[str, Any] | None
) -> None:
    """The request is answered in full: settle it before the answer's last bytes, and keep
    its response where it is to be stored (its record rides in the settle call; its Redis copy
    is written before the client can ask for it)."""
    if response is not None and state.stores:
        keep_response(state, response_record(state, response))
    await reached(state.lease, "limits").submit()
    if state.kept is not None:
        try:
            await runtime.responses.keep(state.kept, state.kept_payload)
        except (RedisUnavailable, RespError) as exc:
            # Settled, billed, and durable in the settle call's stream: the answer goes out,
            # and the response is read from the database once the drain has stored it.
            logger.warning(
                "request %s: no Redis copy of its stored response: %r", state.request_id, exc
            )


async def _while_the_client_waits(
    state: CompletionState, exchange: Coroutine[Any, Any, None]
) -> None:
    """Run the exchange until it ends, the client leaves or the request's time is up."""
    relay = asyncio.ensure_future(exchange)
    disconnect = asyncio.ensure_future(wait_disconnect(state.receive))
    done, _ = await asyncio.wait(
        (relay, disconnect), timeout=state.time_left(), return_when=asyncio.FIRST_COMPLETED
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
        raise state.timed_out()
    # The client left: what was generated is charged; closing the response aborted vLLM's work.
    raise ClientLeft


def _identity(state: CompletionState) -> dict[str, str]:
    return identity(
        model=reached(state.request, "parse").model,
        version_tag=reached(state.node, "connect").version_tag,
    )


def _answer(state: CompletionState) -> Answer:
    request = reached(state.request, "parse")
    return Answer(request_id=state.request_id, request=request, identity=_identity(state))


async def _relay(
    state: CompletionState, runtime: GatewayRuntime, response: UpstreamResponse
) -> None:
    request, lease = reached(state.request, "parse"), reached(state.lease, "limits")
    editor = state.editor = StreamEditor(
        runtime.content_filter,
        endpoint=request.endpoint,
        include_usage=request.include_usage,
        identity=_identity(state),
    )
    writer = state.writer = state.dialect.writer(_answer(state), editor)
    reply, dispatch = state.reply, reached(state.dispatch, "route")
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
                state.clock.mark(Stage.DECODE)
                held.append(writer.end(cut=False))
                await _settle(state, runtime, writer.final)
                continue
            if data.startswith(b'{"error"'):
                error = stream_error(data)
                if isinstance(error, UpstreamError):
                    # The node's failure: what came before it reaches the client first.
                    if held and (reply.started or events > 1):
                        await reply.body(b"".join(held), more=True)
                    raise stream_failed(error)
                held.append(_refusal(state, error))
                continue
            events += 1
            edited = editor.edit(data)
            if editor.first_content and state.first_token_at is None:
                state.first_token_at = state.clock.mark(Stage.TTFT)
                dispatch.first_token()
            if edited is not None:
                held.append(writer.chunk(edited))
            if editor.blocked is not None:
                await _end_blocked(state, runtime, held)
                return
        if held and (reply.started or events > 1 or lease.submitted):
            await reply.body(b"".join(held), more=True)
            held = []
    if not lease.submitted:
        # The node closed the stream without [DONE]: it failed mid-generation.
        raise stream_failed(
            UpstreamError(
                "The model server ended the stream early.", code=GatewayErrorCode.UPSTREAM_ERROR
            )
        )
    await reply.body(b"".join(held), more=False)


def _refusal(state: CompletionState, error: ApplicationError) -> bytes:
    """The engine refused the request in its stream (a 4xx: the client's error, no failure of
    the node's). Before any byte: raised, to be answered with its status; after: the event in
    the client's API."""
    if not state.reply.started:
        raise error
    state.outcome = UsageStatus.REJECTED
    state.error_code = str(error.code)
    return reached(state.writer, "answer").error(error)


async def _end_blocked(state: CompletionState, runtime: GatewayRuntime, out: list[bytes]) -> None:
    """The output hit a blocked term: finish the stream here, bill what was generated."""
    state.outcome = UsageStatus.CONTENT_FILTERED
    state.clock.mark(Stage.DECODE)
    writer = reached(state.writer, "answer")
    out.append(writer.end(cut=True))
    await _settle(state, runtime, writer.final)
    await state.reply.body(b"".join(out), more=False)
