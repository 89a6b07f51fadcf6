"""The hop to a vLLM node: pick one, send over the pooled client, retry once before any byte."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from django.conf import settings
from prometheus_client import Gauge

from apps.gateway.errors import GatewayErrorCode
from apps.gateway.schemas import CompletionRequest
from apps.gateway.tracing import Trace
from apps.gateway.upstream_http import UpstreamConnectionError, UpstreamResponse, UpstreamTimeout
from apps.hardware.fleet import NodeSnapshot
from dmxplatform import metrics
from dmxplatform.errors import (
    ApplicationError,
    InvalidRequestError,
    ServiceUnavailableError,
    UpstreamError,
)

if TYPE_CHECKING:
    from apps.gateway.runtime import GatewayRuntime

# One retry on another node, and only before the client has seen a byte: after that a retry
# could duplicate text the client already holds.
MAX_ATTEMPTS = 2
# vLLM schedules lower priorities first; our tiers rank higher tiers first (PriorityTier).
VLLM_PRIORITY_OF_TIER = 2
_UPSTREAM_FAILURES = (UpstreamConnectionError, TimeoutError, OSError)


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


def no_capacity(model: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"No node can serve model `{model}` right now. Please retry shortly.",
        code=GatewayErrorCode.NO_CAPACITY,
        headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
    )


Route = Callable[[list[int]], Awaitable[NodeSnapshot | None]]


@contextlib.asynccontextmanager
async def connect(
    runtime: GatewayRuntime,
    request: CompletionRequest,
    route: Route,
    *,
    priority: int,
    time_left: Callable[[], float],
    request_id: str,
    trace: Trace,
) -> AsyncIterator[tuple[NodeSnapshot, UpstreamResponse]]:
    """Yield the first node that answers below 500 and its response; retry once on failure.

    `route(tried)` picks a node other than those tried. A node that fails counts against its
    circuit breaker. On exit the connection goes back to the pool when the body was read to
    the end, and is closed otherwise, which makes vLLM abort the generation.

    Each call carries the request id (vLLM takes it for its own, so its logs and spans name
    the request as ours do) and, traced, the call's span context (`traceparent`).
    """
    tried: list[int] = []
    failure: ApplicationError | None = None
    request_id_header = b"X-Request-Id: %s\r\n" % request_id.encode()
    for _ in range(MAX_ATTEMPTS):
        node = await route(tried)
        if node is None:
            break
        tried.append(node.id)
        inflight = _hold(runtime, node)
        call = trace.upstream_call(node, request.endpoint.path)
        try:
            response = await runtime.http.post(
                node.url + request.endpoint.path,
                upstream_body(request, node, priority=priority),
                # Unstreamed, vLLM answers once the whole completion is generated: the wait is
                # the request's, not a sign of a dead node.
                first_byte=None if request.stream else max(time_left(), 0.001),
                headers=request_id_header + call.traceparent,
            )
        except UpstreamTimeout:
            _release(runtime, node, inflight)
            call.end(error="timeout")
            raise
        except _UPSTREAM_FAILURES as exc:
            _release(runtime, node, inflight)
            call.end(error=exc.__class__.__name__)
            metrics.gateway_upstream_errors.labels("connect").inc()
            await runtime.observe(node, failed=True)
            failure = UpstreamError(
                f"Node {node.name} could not be reached: {exc.__class__.__name__}.",
                code=GatewayErrorCode.UPSTREAM_ERROR,
            )
            continue
        if response.status >= 500:
            failure = upstream_error(response.status, await response.read())
            response.release()
            _release(runtime, node, inflight)
            call.end(status=response.status)
            metrics.gateway_upstream_errors.labels(str(response.status)).inc()
            await runtime.observe(node, failed=True)
            continue
        try:
            yield node, response
        finally:
            response.release()
            _release(runtime, node, inflight)
            runtime.queues.wake(node.model)
            call.end(status=response.status)
        return
    if failure is None:
        metrics.gateway_refusals.labels("no_capacity").inc()
        raise no_capacity(request.model)
    raise failure


_INFLIGHT = metrics.Bound(metrics.gateway_node_inflight)


def _hold(runtime: GatewayRuntime, node: NodeSnapshot) -> Gauge:
    """Count a request in flight on the node: for routing (this process) and for /metrics."""
    runtime.fleet.inflight[node.id] += 1
    gauge = _INFLIGHT(node.name)
    gauge.inc()
    return gauge


def _release(runtime: GatewayRuntime, node: NodeSnapshot, gauge: Gauge) -> None:
    runtime.fleet.inflight[node.id] -= 1
    gauge.dec()
