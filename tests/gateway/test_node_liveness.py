"""A node that dies stops receiving traffic within a bounded time; one that stops, drains."""

from __future__ import annotations

import time

from django.conf import settings

from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.hardware.nodestate import NodeSnapshot, fleet_key
from dmxplatform.redis_client import sync_redis
from tests.conftest import wait_until_served
from tests.http import call
from tests.stack import wait_for


def ask(platform, model: str):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return call(
        "POST", platform.api_url + "/chat/completions", key=platform.api_key, json_body=body
    )


def node_of(worker) -> Node:
    return Node.objects.get(name=f"test-dmx-tiny-b-{worker.port}")


def live_state_of(worker) -> NodeSnapshot:
    """The node as gateways route on it: heartbeats land here; the Node row follows on sync."""
    return NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node_of(worker).id)))


def test_killed_worker_goes_down_and_gateway_answers_503(platform, committed):
    worker = platform.workers["dmx-tiny-b"]
    assert ask(platform, "dmx-tiny-b").status == 200

    killed_at = time.monotonic()
    worker.kill_hard()

    # The gateway stops routing once heartbeats are stale, before any database write; until
    # then the dead node is tried and refuses: 503 too (every node tried failed), never a 502.
    bound = settings.DMX_NODE_STALE_SECONDS + 2.0
    answers: list[tuple[int, str]] = []

    def routed_away():
        reply = ask(platform, "dmx-tiny-b")
        answers.append((reply.status, reply.json()["error"]["code"] if reply.status != 200 else ""))
        assert reply.status != 503 or "retry-after" in reply.headers, answers
        return answers[-1] == (503, "no_capacity") and reply

    wait_for(
        routed_away,
        timeout=bound,
        interval=0.1,
        what="the gateway to stop routing to the dead node",
    )
    assert set(answers[:-1]) <= {(503, "upstream_unavailable")}, answers
    # And the platform marks it down in the database (Celery's stale check).
    wait_for(
        lambda: node_of(worker).status == NodeStatus.DOWN,
        timeout=bound + 3,
        what="the node to be marked down",
    )
    assert time.monotonic() - killed_at < bound + 3
    assert ask(platform, "dmx-tiny").status == 200  # the other model is unaffected


def test_sigterm_drains_in_flight_requests_then_reports_down(platform, committed):
    """Run after the kill test: bring dmx-tiny-b back, then stop it gracefully mid-request."""
    import threading

    # A drain long enough for 1,200 tokens on a loaded CI machine (three engines on two cores
    # have taken over 10 s): the test is of draining, not of the drain's time limit.
    drain = 120
    worker = platform.stack.start_worker(
        model_name="dmx-tiny-b", node_token=platform.node_token, drain_timeout=drain
    )
    platform.workers["dmx-tiny-b"] = worker
    wait_until_served(platform, "dmx-tiny-b", worker)

    result = {}

    def long_request():
        body = {
            "model": "dmx-tiny-b",
            "messages": [{"role": "user", "content": "go"}],
            # Long enough for a heartbeat to see it running on a quiet machine (300 once
            # finished between two of them).
            "max_tokens": 1200,
            "ignore_eos": True,
        }
        result["reply"] = call(
            "POST", platform.api_url + "/chat/completions", key=platform.api_key, json_body=body
        )

    thread = threading.Thread(target=long_request)
    thread.start()
    wait_for(
        lambda: live_state_of(worker).engine.num_requests_running > 0,
        timeout=10,
        interval=0.05,
        what="the request to start",
    )
    worker.stop(timeout=drain + 20)  # SIGTERM, and waits for the worker to exit
    thread.join(timeout=30)

    reply = result["reply"]
    assert reply.status == 200, reply.body  # the in-flight request finished
    assert reply.json()["usage"]["completion_tokens"] == 1200
    assert live_state_of(worker).status == NodeStatus.DOWN  # reported by the worker itself
    wait_for(
        lambda: node_of(worker).status == NodeStatus.DOWN,
        timeout=settings.DMX_NODE_STALE_CHECK_SECONDS + 2,
        what="the Node row to follow",
    )
    assert ask(platform, "dmx-tiny-b").status == 503
