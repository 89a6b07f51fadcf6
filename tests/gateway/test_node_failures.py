"""A node that fails before the client has seen a byte: the request is served by another node,
billed once, and the failing node's breaker counts it; one that fails after: the client's stream
ends with its API's error event and it pays what the node generated (issue 30).

Two nodes serve one model from one real vLLM engine: its own worker's node, and a second node
(an attached worker) that gateways reach through a fault on the network path: streams cut after
vLLM's first event (the role chunk), with a reset as from a killed engine or a plain early close,
or connections refused. The first event is held back from the client, so the client has seen
nothing when the node fails: another node must serve the request.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from apps.billing.models import UsageRecord
from apps.hardware.models import Node
from apps.hardware.services import node_drain, node_undrain
from apps.routing.breaker import Breaker, breakers_key
from dmxplatform.redis_client import sync_redis
from tests.conftest import TINY_CONTEXT, RunningPlatform, fleet_node, serving_worker
from tests.faults import Sent, StreamCutter, assert_recorded_once, send_chat_stream
from tests.http import call
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.stack import Worker, wait_for

MODEL = "dmx-failover"
# Unique prompts spread over both nodes (a prompt no node caches is homed by its hash), so the
# faulty node is some request's first choice within a few; the bound is far past that.
MAX_REQUESTS = 40
TOKENS = 6


@pytest.fixture(scope="module")
def engine(platform: RunningPlatform, django_db_blocker) -> Iterator[Worker]:
    """A real vLLM worker for MODEL: the healthy node, and the engine behind the faulty one."""
    with django_db_blocker.unblock():
        make_model(MODEL, max_context_tokens=TINY_CONTEXT)
    with serving_worker(platform, MODEL) as worker:
        yield worker


def _node_id(name: str) -> int | None:
    node = fleet_node(name)
    return node.id if node is not None and node.status == "up" else None


@pytest.fixture
def faulty(platform: RunningPlatform, engine: Worker) -> Iterator[tuple[StreamCutter, int]]:
    """A second node on the same engine, reached through a StreamCutter (cutting nothing yet);
    new for each test, so each starts with a closed breaker."""
    proxy = StreamCutter(("127.0.0.1", engine.port), events=10**9, reset=False)
    worker = platform.stack.start_worker(
        model_name=MODEL,
        node_token=platform.node_token,
        attach=f"http://127.0.0.1:{engine.port}",
        advertise=f"http://127.0.0.1:{proxy.port}",
    )
    try:
        node_id = wait_for(
            lambda: _node_id(worker.node_name), timeout=60, what="the faulty node up"
        )
        yield proxy, node_id
    finally:
        worker.stop()
        proxy.close()


def _failures(node_id: int) -> int:
    raw = sync_redis().hget(breakers_key(), str(node_id))
    return Breaker.parse(raw).failures if raw else 0


# vLLM's answer when its engine core has died (EngineDeadError: a crash, out of GPU memory).
ENGINE_DEAD = {
    "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "type": "InternalServerError",
}


@pytest.mark.parametrize(
    "fault",
    ["reset-after-first-event", "closed-after-first-event", "refused", "engine-dead-500"],
)
def test_a_node_failing_before_the_client_saw_a_byte_hands_the_request_to_the_other(
    platform, committed, faulty, fault
):
    proxy, node_id = faulty
    if fault == "refused":
        proxy.cut()
    elif fault == "engine-dead-500":
        proxy.fail_with(500, ENGINE_DEAD)
    else:
        proxy.events, proxy.reset = 1, fault.startswith("reset")
    api_key, secret = make_api_key()
    sent: list[Sent] = []
    while _failures(node_id) == 0:
        assert len(sent) < MAX_REQUESTS, f"{MAX_REQUESTS} requests, none tried the faulty node"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{uuid.uuid4()} tell me something"}],
            "max_tokens": TOKENS,
            "ignore_eos": True,
        }
        reply, _ = send_chat_stream(platform.api_url, secret, body, timeout=60)
        assert (reply.status, reply.completion_tokens) == (200, TOKENS), (len(sent), reply)
        sent.append(reply)
    # Each served by the healthy node and billed once, with what its client got.
    assert_recorded_once(sent, key=api_key)


def _stream(url: str, secret: str, body: dict) -> tuple[str, list[dict]]:
    """POST a streamed request; its request id and every event's data, read to the end."""
    request = urllib.request.Request(
        url,
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        events = [
            json.loads(line[len(b"data: ") :])
            for line in response
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"
        ]
        return response.headers["x-request-id"], events


# Each API's own error event, as the client's SDK reads it.
ERROR_EVENT = {
    "/v1/chat/completions": lambda e: e.get("error", {}).get("code") == "upstream_error",
    "/v1/responses": lambda e: e.get("type") == "response.failed",
    "/v1/messages": lambda e: e.get("type") == "error" and e["error"]["type"] == "api_error",
}
REQUESTS = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "{prompt}"}]},
    "/v1/responses": {"input": "{prompt}"},
    "/v1/messages": {"messages": [{"role": "user", "content": "{prompt}"}]},
}


@pytest.mark.parametrize("path", list(REQUESTS), ids=["chat", "responses", "messages"])
def test_an_engine_killed_after_the_client_got_tokens_ends_the_stream_in_the_apis_shape(
    platform, committed, faulty, path
):
    """The client has its first tokens when the node's connection is reset: it gets the error
    event its API defines, pays the tokens the node generated up to the cut, and the breaker
    counts the failure."""
    proxy, node_id = faulty
    proxy.events, proxy.reset = 4, True  # the role chunk and three tokens
    _, secret = make_api_key()
    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    for _ in range(MAX_REQUESTS):
        body = json.loads(
            json.dumps(REQUESTS[path]).replace("{prompt}", f"{uuid.uuid4()} tell me more")
        )
        body |= {"model": MODEL, limit: 64, "ignore_eos": True}
        request_id, events = _stream(platform.url + path, secret, body)
        if ERROR_EVENT[path](events[-1]):
            break
        assert not any("error" in str(e.get("type", "")) or "error" in e for e in events)
    else:
        pytest.fail(f"{MAX_REQUESTS} requests, none tried the faulty node")
    assert _failures(node_id) == 1
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what="the cut stream's usage record",
    )
    assert (record.status, record.http_status) == ("upstream_error", 502)
    assert record.completion_tokens == proxy.cut_usage[-1] > 0


def _ask(platform: RunningPlatform, secret: str):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{uuid.uuid4()} tell me something"}],
        "max_tokens": TOKENS,
    }
    return call("POST", platform.api_url + "/chat/completions", key=secret, json_body=body)


def _record(request_id: str) -> UsageRecord:
    return wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what=f"the usage record of {request_id}",
    )


@pytest.fixture
def only_the_faulty_node(engine: Worker, faulty) -> Iterator[tuple[StreamCutter, int]]:
    """The engine's own node drained: gateways route MODEL to the faulty node alone (once
    their fleet refresh has seen the drain)."""
    healthy = Node.objects.get(name=engine.node_name)
    node_drain(node=healthy)
    try:
        yield faulty
    finally:
        node_undrain(node=healthy)


def test_an_engine_that_cannot_serve_leaves_the_request_no_node_503_with_retry_after(
    platform, committed, only_the_faulty_node
):
    """Item 4 of issue 30: the only node's engine is dead (vLLM's 500): no capacity now, so
    503 with Retry-After in the API's shape, the breaker counts it, nothing is billed."""
    proxy, node_id = only_the_faulty_node
    proxy.fail_with(500, ENGINE_DEAD)
    _, secret = make_api_key()

    def refused():
        reply = _ask(platform, secret)
        # Until the gateway's refresh sees the drain, the healthy node answers.
        assert reply.status in (200, 503), reply
        return reply if reply.status == 503 else None

    reply = wait_for(refused, timeout=30, interval=0.1, what="a request with no node left")
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable"), error
    assert int(reply.headers["retry-after"]) > 0
    assert _failures(node_id) >= 1
    record = _record(reply.headers["x-request-id"])
    assert (record.status, record.http_status) == ("upstream_error", 503)
    assert (record.prompt_tokens, record.completion_tokens) == (0, 0)


def test_an_engines_own_refusal_is_the_clients_error_and_no_failure_of_the_node(
    platform, committed, faulty
):
    """Item 4 of issue 30: vLLM refusing a request (400) is answered as the client's error,
    its message kept, and counts against no node."""
    proxy, node_id = faulty
    refusal = "This model's maximum context length is 2048 tokens."
    proxy.fail_with(400, {"message": refusal, "type": "BadRequestError"})
    _, secret = make_api_key()
    for _ in range(MAX_REQUESTS):
        reply = _ask(platform, secret)
        if reply.status != 200:
            break
    else:
        pytest.fail(f"{MAX_REQUESTS} requests, none tried the faulty node")
    assert reply.status == 400, reply
    error = reply.json()["error"]
    assert (error["type"], error["message"]) == ("invalid_request_error", refusal)
    assert _failures(node_id) == 0
    record = _record(reply.headers["x-request-id"])
    assert (record.status, record.http_status) == ("rejected", 400)
    assert (record.prompt_tokens, record.completion_tokens) == (0, 0)
