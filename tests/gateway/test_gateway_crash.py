"""A gateway killed the moment it has answered: the requests it answered keep their records;
one told to stop: its streams end by their bound, and so does the process.

The settle call (usage event included) is in the kernel's socket to Redis before the response's
last bytes are written (apps/gateway/pipeline.py), so SIGKILL right after the client has its
answer cannot take the record with it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from apps.billing.models import UsageRecord
from tests.conftest import SERVED_MODELS
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_gateway_killed_right_after_answering_loses_no_record(platform, committed, stream):
    _, secret = make_api_key()
    gateway, url = platform.stack.spare_gateway(f"gateway-doomed-{'stream' if stream else 'json'}")
    try:
        reply = call(
            "POST",
            url + "/v1/chat/completions",
            key=secret,
            json_body={
                "model": SERVED_MODELS[0],
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "ignore_eos": True,
                "stream": stream,
            },
        )
        gateway.process.send_signal(signal.SIGKILL)  # before it can do anything more
        assert reply.status == 200, reply.body
        assert stream == reply.body.rstrip().endswith(b"data: [DONE]")
    finally:
        gateway.stop()
    request_id = reply.headers["x-request-id"]
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what="the answered request's usage record",
    )
    assert (record.status, record.completion_tokens) == ("ok", 4)


def test_a_stopped_gateway_ends_its_streams_at_their_bound_and_exits(platform, committed):
    """Told to stop, a gateway waits for its streams, but not past the longest a request may
    take: such a stream ends with an error event, is billed what it generated, and the process
    exits within the bound (there was none: a stream could hold a stopping gateway forever)."""
    # The margin covers the request's own timer firing late: relaying 16 busy streams keeps the
    # gateway's loop behind, and 1 s once let the shutdown cut the stream before its error event.
    timeout, margin = 4, 3
    _, secret = make_api_key()
    gateway, url = platform.stack.spare_gateway(
        "gateway-bounded",
        settings={
            "DMX_REQUEST_TIMEOUT_SECONDS": str(timeout),
            "DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS": str(margin),
        },
    )
    events: list[bytes] = []
    started = threading.Event()
    # Far more than the bound on any CPU: the tiny model alone once streamed 1,900 tokens in
    # under 4 s on a quiet machine; 16 choices of them (the engine's --max-num-seqs) take longer.
    choices, tokens = 16, 1900

    def stream() -> None:
        body = {
            "model": SERVED_MODELS[0],
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens,
            "n": choices,
            "ignore_eos": True,
            "stream": True,
        }
        request = urllib.request.Request(
            url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
        try:
            response = urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as error:  # no first token within the bound at all
            events.append(error.read())
            started.set()
            return
        with response:
            events.append(response.headers["x-request-id"].encode())
            for line in response:
                started.set()
                if line.startswith(b"data: "):
                    events.append(line)

    client = threading.Thread(target=stream)
    try:
        client.start()
        assert started.wait(timeout=30)
        stopped_at = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        gateway.process.wait(timeout=timeout + margin + 10)
        exited_after = time.monotonic() - stopped_at
        client.join(timeout=10)
    finally:
        gateway.stop()
    assert exited_after < timeout + margin + 3
    assert events[0].startswith(b"req_"), f"no stream started within {timeout} s: {events}"
    error = json.loads(events[-1][len(b"data: ") :])["error"]
    assert error["code"] == "request_timeout"
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=events[0].decode()).first(),
        timeout=30,
        what="the cut stream's usage record",
    )
    assert (record.status, record.http_status) == ("timed_out", 504)
    assert 0 < record.completion_tokens < choices * tokens
