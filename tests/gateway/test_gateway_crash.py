"""A gateway killed the moment it has answered: the requests it answered keep their records.

The settle call (usage event included) is in the kernel's socket to Redis before the response's
last bytes are written (apps/gateway/pipeline.py), so SIGKILL right after the client has its
answer cannot take the record with it.
"""

from __future__ import annotations

import signal

import pytest

from apps.keys.models import UsageRecord
from tests.conftest import SERVED_MODELS
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

pytestmark = pytest.mark.e2e


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
