"""The hop to a vLLM node: the body it gets, the call over the pooled client, its errors.

Which node, and another one when a call fails, is routing's (apps.routing.dispatcher): the
sender here tells it a node failed by raising NodeFailed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from apps.gateway import sse
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.schemas import CompletionRequest
from apps.gateway.tracing import Trace, UpstreamCall
from apps.gateway.upstream_http import (
    HttpPool,
    UpstreamConnectionError,
    UpstreamResponse,
    UpstreamTimeout,
)
from apps.routing.dispatcher import NodeFailed, NodeSnapshot
from dmxplatform import metrics
from dmxplatform.errors import ApplicationError, InvalidRequestError, UpstreamError
from dmxplatform.stages import Stage, StageClock

# vLLM schedules lower priorities first; our tiers rank higher tiers first (PriorityTier).
VLLM_PRIORITY_OF_TIER = 2
_UPSTREAM_FAILURES = (UpstreamConnectionError, TimeoutError, OSError)
# A stream is the node's answer once it carries this many events (or its end): vLLM sends the
# first (the role chunk) before its engine has taken the request, so one proves nothing.
EVENTS_TO_ANSWER = 2
_STREAM_FAILURES = metrics.gateway_upstream_errors.labels("stream")


def upstream_body(request: CompletionRequest, node: NodeSnapshot, *, priority: int) -> bytes:
    """Return the body for vLLM: the node's model name; on streams, usage on every chunk
    (vLLM's continuous usage stats), so a stream cut short is billed to the token; and the
    key's priority where the engine schedules by it (lower is sooner in vLLM)."""
    payload = dict(request.payload, model=node.served_model_name)
    if request.stream:
        payload["stream_options"] = {
            **(payload.get("stream_options") or {}),
            "include_usage": True,
            "continuous_usage_stats": True,
        }
    if node.priority_scheduling:
        payload["priority"] = VLLM_PRIORITY_OF_TIER - priority
    return orjson.dumps(payload)


def upstream_error(status: int, body: bytes) -> ApplicationError:
    """Translate a vLLM error response into our error shape; vLLM's codes are integers."""
    message = f"The model server answered {status}."
    param = None
    try:
        error = orjson.loads(body).get("error") or {}
        message = error.get("message") or message
        param = error.get("param")
    except (orjson.JSONDecodeError, AttributeError):
        pass
    if 400 <= status < 500:
        return InvalidRequestError(message, param=param, code=GatewayErrorCode.INVALID_VALUE)
    return UpstreamError(message, code=GatewayErrorCode.UPSTREAM_ERROR)


def stream_error(data: bytes) -> ApplicationError:
    """Translate an error event vLLM sent inside a stream: its `code` is the HTTP status the
    request would have had unstreamed (400 for a request the engine refuses)."""
    try:
        status = int((orjson.loads(data).get("error") or {}).get("code") or 500)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        status = 500
    return upstream_error(status if 400 <= status < 600 else 500, data)


class Exchange:
    """A request a node answered below 500: its response and the call's span, closed together.
    Closing returns the connection to the pool when the body was read to the end and closes it
    otherwise, which makes vLLM abort the generation."""

    __slots__ = ("call", "response")

    def __init__(self, response: UpstreamResponse, call: UpstreamCall) -> None:
        self.response = response
        self.call = call

    def __enter__(self) -> UpstreamResponse:
        return self.response

    def __exit__(self, *exc_info) -> None:
        self.response.release()
        self.call.end(status=self.response.status)


def stream_failed(error: ApplicationError) -> NodeFailed:
    """A node's stream failed (a server error event, an early end, a cut): counted once here,
    and the node's failure for routing."""
    _STREAM_FAILURES.inc()
    return NodeFailed(error)


async def stream_answered(response: UpstreamResponse, node: NodeSnapshot) -> None:
    """Read a stream's head until the node has answered: EVENTS_TO_ANSWER events, its end, or
    an error event of the request's own (4xx); raise NodeFailed if the node dies, ends the
    stream or sends a server error first. What was read is put back for the relay: the client
    has seen none of it, so another node may still serve the request."""
    splitter = sse.EventSplitter()
    read: list[bytes] = []
    events = 0
    chunks = response.chunks()
    try:
        async for chunk in chunks:
            read.append(chunk)
            for event in splitter.feed(chunk):
                data = sse.data_of(event)
                if data is None:
                    continue
                if data == sse.DONE:
                    return
                if data.startswith(b'{"error"'):
                    error = stream_error(data)
                    if isinstance(error, UpstreamError):
                        raise stream_failed(error)
                    return
                events += 1
            if events >= EVENTS_TO_ANSWER:
                return
    except UpstreamConnectionError as exc:
        raise stream_failed(
            UpstreamError(
                f"Node {node.name} failed before it answered: {exc}",
                code=GatewayErrorCode.UPSTREAM_ERROR,
            )
        ) from exc
    finally:
        await chunks.aclose()
        response.unread(b"".join(read))
    raise stream_failed(
        UpstreamError(
            f"Node {node.name} ended the stream before it answered.",
            code=GatewayErrorCode.UPSTREAM_ERROR,
        )
    )


def sender(
    http: HttpPool,
    request: CompletionRequest,
    *,
    priority: int,
    time_left: Callable[[], float],
    request_id: str,
    trace: Trace,
    clock: StageClock,
) -> Callable[[NodeSnapshot], Awaitable[Exchange]]:
    """The call of `request` to a node, for routing's Dispatch.connect: it answers below 500
    (a stream: with its first events, stream_answered), or raises NodeFailed (unreachable, a
    5xx, a stream that fails before it answered) for routing to try another node.

    The connect stage ends when the node's response begins: a stream's head, read here, is its
    time to first token, as when the relay reads it.

    Each call carries the request id (vLLM takes it for its own, so its logs and spans name
    the request as ours do) and, traced, the call's span context (`traceparent`).
    """
    request_id_header = b"X-Request-Id: %s\r\n" % request_id.encode()

    async def send(node: NodeSnapshot) -> Exchange:
        call = trace.upstream_call(node, request.endpoint.path)
        try:
            response = await http.post(
                node.url + request.endpoint.path,
                upstream_body(request, node, priority=priority),
                # Unstreamed, vLLM answers once the whole completion is generated: the wait is
                # the request's, not a sign of a dead node.
                first_byte=None if request.stream else max(time_left(), 0.001),
                headers=request_id_header + call.traceparent,
            )
        except UpstreamTimeout:
            call.end(error="timeout")
            raise
        except _UPSTREAM_FAILURES as exc:
            call.end(error=exc.__class__.__name__)
            metrics.gateway_upstream_errors.labels("connect").inc()
            raise NodeFailed(
                UpstreamError(
                    f"Node {node.name} could not be reached: {exc.__class__.__name__}.",
                    code=GatewayErrorCode.UPSTREAM_ERROR,
                )
            ) from exc
        clock.mark(Stage.CONNECT)
        if response.status >= 500:
            failure = upstream_error(response.status, await response.read())
            response.release()
            call.end(status=response.status)
            metrics.gateway_upstream_errors.labels(str(response.status)).inc()
            raise NodeFailed(failure)
        if request.stream and response.status == 200:
            try:
                await stream_answered(response, node)
            except BaseException as exc:  # NodeFailed, or the client or its time gone
                response.release()
                call.end(status=response.status, error=exc.__class__.__name__)
                raise
        return Exchange(response, call)

    return send
