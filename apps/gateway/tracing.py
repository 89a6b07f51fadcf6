"""OpenTelemetry traces of gateway requests: off unless DMX_OTLP_ENDPOINT is set, and then only
this module imports OpenTelemetry.

A request's trace: a server span from its first byte to its end; under it one span per stage,
made when the request ends from its StageClock's marks (so that a stage costs no more while it
runs), and a client span per call to a node, live, whose context goes to vLLM as W3C
`traceparent`: vLLM started with --otlp-traces-endpoint (inference.worker does so) puts its own
span under it. Ending a span only queues it: the SDK's BatchSpanProcessor sends batches over
OTLP/HTTP from a thread of its own, never from the event loop, and drops spans rather than
wait when the collector falls behind.

Off, `start` returns UNTRACED, whose methods do nothing: a request pays a few calls.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from django.conf import settings

from dmxplatform.stages import LAYER_OF_STAGE, Stage, StageClock, TracedStageClock

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from apps.gateway.schemas import Endpoint
    from apps.gateway.state import CompletionState
    from apps.routing.dispatcher import NodeSnapshot

# Where an OTLP/HTTP collector takes spans, under its base URL.
TRACES_PATH = "/v1/traces"
INSTRUMENTATION = "dmx.gateway"


class UpstreamCall:
    """The span of one call to a node; untraced, nothing."""

    __slots__ = ()
    # The request header line that carries the span's context to the node.
    traceparent = b""

    def end(self, *, status: int = 0, error: str = "") -> None:
        pass


class Trace:
    """A request's trace; this base class is the untraced one (UNTRACED)."""

    __slots__ = ()
    trace_id = ""  # 32 hex digits when the request is traced and sampled

    def new_clock(self) -> StageClock:
        return StageClock()

    def upstream_call(self, node: NodeSnapshot, path: str) -> UpstreamCall:
        return NO_CALL

    def end(self, state: CompletionState) -> None:
        pass


UNTRACED = Trace()
NO_CALL = UpstreamCall()


def start(endpoint: Endpoint, request_id: str) -> Trace:
    """Begin a request's trace, now; UNTRACED when tracing is off."""
    tracer = _tracer()
    if tracer is None:
        return UNTRACED
    return RequestTrace(tracer, endpoint, request_id)


def prepare() -> None:
    """Set tracing up (or learn it is off) before the first request."""
    _tracer()


@functools.cache
def _tracer() -> Tracer | None:
    """The process's tracer, exporting to DMX_OTLP_ENDPOINT; None when tracing is off."""
    endpoint = settings.DMX_OTLP_ENDPOINT
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: settings.DMX_OTEL_SERVICE_NAME}),
        # Every request's span is a root: the ratio decides alone (a client's traceparent is
        # not taken: it would let any client choose what the gateway records).
        sampler=TraceIdRatioBased(settings.DMX_OTEL_SAMPLE_RATIO),
    )
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + TRACES_PATH))
    )
    return provider.get_tracer(INSTRUMENTATION)


class RequestTrace(Trace):
    __slots__ = ("_context", "_epoch_ns", "_started", "_tracer", "span", "trace_id")

    def __init__(self, tracer: Tracer, endpoint: Endpoint, request_id: str) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._tracer = tracer
        self._epoch_ns = time.time_ns()
        self._started = time.perf_counter()
        self.span: Span = tracer.start_span(
            f"POST {endpoint.path}",
            kind=SpanKind.SERVER,
            start_time=self._epoch_ns,
            attributes={
                "http.request.method": "POST",
                "url.path": endpoint.path,
                "dmx.request_id": request_id,
            },
        )
        self._context = set_span_in_context(self.span)
        recording = self.span.is_recording()
        self.trace_id = format(self.span.get_span_context().trace_id, "032x") if recording else ""

    def new_clock(self) -> StageClock:
        # Stage spans only for a sampled request: the others' clocks are the plain kind.
        return TracedStageClock() if self.trace_id else StageClock()

    def upstream_call(self, node: NodeSnapshot, path: str) -> UpstreamCall:
        return _TracedCall(self._tracer, self._context, node, path)

    def end(self, state: CompletionState) -> None:
        """End the request's span, with a span per stage under it (if it is sampled)."""
        span = self.span
        if self.trace_id:
            self._stage_spans(state.clock)
            span.set_attributes(_request_attributes(state))
            if state.http_status >= 500:
                from opentelemetry.trace import StatusCode

                span.set_status(StatusCode.ERROR, state.error_code)
        span.end(end_time=self._epoch_ns_at(time.perf_counter()))

    def _stage_spans(self, clock: StageClock) -> None:
        if not isinstance(clock, TracedStageClock):
            return
        for name, start, end in clock.spans:
            self._tracer.start_span(
                name,
                context=self._context,
                start_time=self._epoch_ns_at(start),
                attributes={"dmx.stage": name, "dmx.layer": LAYER_OF_STAGE[Stage(name)]},
            ).end(end_time=self._epoch_ns_at(end))

    def _epoch_ns_at(self, perf: float) -> int:
        """A perf_counter reading as the wall-clock nanoseconds spans are stamped with."""
        return self._epoch_ns + int((perf - self._started) * 1e9)


def _request_attributes(state: CompletionState) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "http.response.status_code": state.http_status,
        "dmx.outcome": state.outcome.value,
    }
    if state.client_request_id:
        attributes["dmx.client_request_id"] = state.client_request_id
    if state.dispatch is not None:
        attributes["gen_ai.request.model"] = state.dispatch.request.model.name
    if state.node is not None:
        attributes["dmx.node"] = state.node.name
    if state.error_code:
        attributes["error.type"] = state.error_code
    return attributes


class _TracedCall(UpstreamCall):
    __slots__ = ("span", "traceparent")

    def __init__(self, tracer: Tracer, context, node: NodeSnapshot, path: str) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.span = tracer.start_span(
            f"POST {path}",
            context=context,
            kind=SpanKind.CLIENT,
            attributes={"dmx.node": node.name, "url.full": node.url + path},
        )
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(self.span))
        self.traceparent = "".join(f"{k}: {v}\r\n" for k, v in carrier.items()).encode()

    def end(self, *, status: int = 0, error: str = "") -> None:
        span = self.span
        if status:
            span.set_attribute("http.response.status_code", status)
        if error or status >= 500:
            from opentelemetry.trace import StatusCode

            span.set_status(StatusCode.ERROR, error or str(status))
        span.end()
