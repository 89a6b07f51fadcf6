"""OpenTelemetry tracing: off by default and then absent; on, a span per request with one per
stage and one per upstream call under it, exported over OTLP/HTTP, and vLLM's own span in the
same trace, under the upstream call whose traceparent it was sent."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

from apps.billing.models import UsageRecord
from apps.gateway import tracing
from apps.gateway.schemas import Endpoint
from apps.gateway.state import CompletionState
from apps.hardware.nodestate import NodeSnapshot
from dmxplatform.stages import Stage, StageClock, TracedStageClock
from inference.engine import EngineConfig
from tests.conftest import RunningPlatform, wait_until_served
from tests.models.factories import make_model
from tests.stack import PLATFORM_PYTHON, ROOT, Stack, wait_for

TRACED_MODEL = "dmx-traced"
SAMPLED = 0x01  # traceparent's trace-flags bit
# A process in which importing OpenTelemetry fails, as where it is not installed: the gateway's
# request path loads, and a request is timed and ended, untraced.
WITHOUT_OPENTELEMETRY = """
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
import django
django.setup()
import apps.gateway.consumers
from apps.gateway.state import CompletionState
from apps.gateway.schemas import Endpoint
call = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
call.trace.end(call)
print(type(call.clock).__name__, any(m.startswith("opentelemetry") for m in sys.modules))
"""


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, object]


class OtlpReceiver:
    """A collector's OTLP/HTTP traces endpoint, in a thread: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(self.path, ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == tracing.TRACES_PATH
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            ReceivedSpan(
                                service=str(service),
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                attributes=_attributes(span.attributes),
                            )
                        )

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(pairs) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        out[pair.key] = getattr(value, kind) if kind else None
    return out


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    collector = OtlpReceiver()
    yield collector
    collector.close()


@pytest.fixture
def traced(settings, receiver, monkeypatch) -> Iterator[OtlpReceiver]:
    """This process's gateway code tracing to `receiver`, its batches sent every 50 ms."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    settings.DMX_OTLP_ENDPOINT = receiver.url
    tracing._tracer.cache_clear()
    yield receiver
    tracing._tracer.cache_clear()


def _node() -> NodeSnapshot:
    return NodeSnapshot(
        id=1,
        name="n1",
        url="http://10.0.0.9:8000",
        status="up",
        model="m",
        version_id=1,
        version_tag="v1",
        served_model_name="m",
        max_model_len=2048,
        heartbeat_at=0.0,
    )


def test_off_by_default_tracing_costs_a_plain_clock_and_imports_nothing():
    call = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
    assert call.trace is tracing.UNTRACED and call.trace.trace_id == ""
    assert type(call.clock) is StageClock
    assert call.trace.upstream_call(_node(), "/v1/chat/completions").traceparent == b""
    # The gateway's request path without the `tracing` extra: as if OpenTelemetry were absent.
    env = {k: v for k, v in os.environ.items() if k != "DMX_OTLP_ENDPOINT"}
    out = subprocess.run(
        [str(PLATFORM_PYTHON), "-c", WITHOUT_OPENTELEMETRY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["StageClock", "False"]


def test_a_traced_request_has_a_span_per_stage_and_per_upstream_call(traced):
    call = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
    assert isinstance(call.clock, TracedStageClock)
    trace_id = call.trace.trace_id
    assert len(trace_id) == 32 and int(trace_id, 16)
    for stage in (Stage.AUTH, Stage.PARSE, Stage.LIMITS, Stage.ROUTE):
        call.clock.mark(stage)
    upstream = call.trace.upstream_call(_node(), Endpoint.CHAT.path)
    name, _, value = upstream.traceparent.decode().rstrip("\r\n").partition(": ")
    assert name == "traceparent"
    version, traceparent_trace, parent_span, flags = value.split("-")
    assert (version, traceparent_trace) == ("00", trace_id)
    assert int(flags, 16) & SAMPLED
    call.clock.mark(Stage.CONNECT)
    call.clock.mark(Stage.GENERATE)
    upstream.end(status=200)
    call.http_status = 200
    call.trace.end(call)

    spans = wait_for(
        lambda: len(traced.of_trace(trace_id)) == 8 and traced.of_trace(trace_id),
        timeout=10,
        what="the request's 8 spans",
    )
    by_name = {span.name: span for span in spans if span.kind != SpanProto.SPAN_KIND_CLIENT}
    (root,) = [span for span in spans if span.kind == SpanProto.SPAN_KIND_SERVER]
    assert root.name == "POST /v1/chat/completions" and root.parent_span_id == ""
    assert root.service == "dmx-gateway"
    assert root.attributes["dmx.request_id"] == call.request_id
    assert root.attributes["http.response.status_code"] == 200
    stages = ["auth", "parse", "limits", "route", "connect", "generate"]
    assert sorted(by_name) == sorted([*stages, root.name])
    for stage in stages:
        assert by_name[stage].parent_span_id == root.span_id
        assert by_name[stage].attributes["dmx.stage"] == stage
    assert by_name["route"].attributes["dmx.layer"] == "routing"
    (client,) = [span for span in spans if span.kind == SpanProto.SPAN_KIND_CLIENT]
    assert client.parent_span_id == root.span_id
    assert client.span_id == parent_span  # the context vLLM was sent is this span's
    assert client.attributes["dmx.node"] == "n1"
    assert client.attributes["http.response.status_code"] == 200


def test_an_unsampled_request_records_nothing_and_tells_vllm_so(traced, settings):
    settings.DMX_OTEL_SAMPLE_RATIO = 0.0
    tracing._tracer.cache_clear()
    call = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
    assert call.trace.trace_id == "" and type(call.clock) is StageClock
    upstream = call.trace.upstream_call(_node(), Endpoint.CHAT.path)
    flags = upstream.traceparent.decode().rstrip().rsplit("-", 1)[1]
    assert not int(flags, 16) & SAMPLED  # vLLM, whose sampler follows its parent's, skips it too
    upstream.end(status=200)
    call.trace.end(call)
    settings.DMX_OTEL_SAMPLE_RATIO = 1.0
    tracing._tracer.cache_clear()
    sampled = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
    sampled.trace.end(sampled)
    wait_for(lambda: traced.of_trace(sampled.trace.trace_id), timeout=10, what="a sampled span")
    assert all(span.trace_id == sampled.trace.trace_id for span in traced.spans)


def test_the_worker_tells_vllm_where_to_export_its_spans(tmp_path):
    config = EngineConfig(
        model="m",
        served_model_name="m",
        host="127.0.0.1",
        port=8100,
        run_dir=tmp_path,
        otlp_endpoint="http://collector:4318/",
    )
    command = config.command()
    at = command.index("--otlp-traces-endpoint")
    assert command[at + 1] == "http://collector:4318/v1/traces"
    env = config.environment()
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    untraced = EngineConfig(
        model="m", served_model_name="m", host="127.0.0.1", port=8100, run_dir=tmp_path
    )
    assert "--otlp-traces-endpoint" not in untraced.command()


def test_vllm_joins_the_gateways_trace(platform, committed, receiver):
    """A gateway and a vLLM worker both tracing to one collector: the request's spans, the
    stages', the upstream call's and vLLM's own, are one trace, vLLM's under the call's."""
    make_model(TRACED_MODEL, max_context_tokens=2048)
    env = {
        **platform.stack.env,
        "DMX_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    stack = Stack(env=env, name="tracing")
    try:
        stack.start_gateway()
        worker = stack.start_worker(model_name=TRACED_MODEL, node_token=platform.node_token)
        running = RunningPlatform(
            stack=stack,
            node_token=platform.node_token,
            api_key=platform.api_key,
            workers={TRACED_MODEL: worker},
            database=platform.database,
        )
        wait_until_served(running, TRACED_MODEL, worker)
        request = urllib.request.Request(
            running.api_url + "/chat/completions",
            data=json.dumps(
                {
                    "model": TRACED_MODEL,
                    "messages": [{"role": "user", "content": "Hello"}],
                    "max_tokens": 5,
                    "stream": True,
                }
            ).encode(),
            headers={
                "Authorization": f"Bearer {platform.api_key}",
                "Content-Type": "application/json",
                "X-Client-Request-Id": "traced-1",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            request_id = response.headers["x-request-id"]
            assert response.read().rstrip().endswith(b"data: [DONE]")

        record = wait_for(
            lambda: UsageRecord.objects.filter(request_id=request_id).first(),
            timeout=30,
            what="the usage record",
        )
        trace_id = record.trace_id
        assert len(trace_id) == 32

        def whole() -> list[ReceivedSpan] | None:
            spans = receiver.of_trace(trace_id)
            engine = any(span.service == "vllm" for span in spans)
            # The request's span ends last, with its stages' (the call's may come before).
            root = any(
                span.kind == SpanProto.SPAN_KIND_SERVER and span.service == "dmx-gateway"
                for span in spans
            )
            return spans if engine and root else None

        spans = wait_for(whole, timeout=30, what="the gateway's and vLLM's spans")
        gateway = [span for span in spans if span.service == "dmx-gateway"]
        (root,) = [span for span in gateway if span.kind == SpanProto.SPAN_KIND_SERVER]
        assert root.parent_span_id == ""
        assert root.attributes["dmx.request_id"] == request_id
        assert root.attributes["dmx.client_request_id"] == "traced-1"
        assert root.attributes["dmx.node"] == worker.node_name
        stages = {span.name for span in spans if span.parent_span_id == root.span_id}
        assert {"auth", "parse", "limits", "route", "connect", "ttft", "decode"} <= stages
        assert stages - set(record.timings) == {"POST /v1/chat/completions"}  # + the call
        (call,) = [span for span in gateway if span.kind == SpanProto.SPAN_KIND_CLIENT]
        assert call.parent_span_id == root.span_id
        engine = [span for span in spans if span.service == "vllm"]
        assert engine and all(span.parent_span_id == call.span_id for span in engine)
        # vLLM took our id for the request it traced.
        assert any(request_id in str(span.attributes.values()) for span in engine)
    finally:
        stack.stop()
