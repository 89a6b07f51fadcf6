"""Our request id reaches vLLM, which takes it for its own; a client's X-Client-Request-Id is
kept with the usage record and answered back, and one that cannot be kept is refused."""

from __future__ import annotations

import json
import urllib.request

import pytest

from apps.billing.models import UsageRecord
from apps.gateway.request_ids import MAX_CLIENT_REQUEST_ID, accept_client_request_id
from dmxplatform.errors import InvalidRequestError
from inference.engine import EngineConfig
from tests.http import call
from tests.stack import wait_for

MODEL = "dmx-tiny"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}


def _scope(value: bytes) -> dict:
    return {"headers": [(b"content-type", b"application/json"), (b"x-client-request-id", value)]}


@pytest.mark.parametrize(
    "value", [b"a", b"order 42/retry-1", b"~" * MAX_CLIENT_REQUEST_ID, bytes(range(0x20, 0x7F))]
)
def test_a_client_request_id_of_printable_ascii_is_kept_and_answered(value):
    headers = [(b"x-request-id", b"req_1")]
    assert accept_client_request_id(_scope(value), headers) == value.decode()
    assert headers == [(b"x-request-id", b"req_1"), (b"x-client-request-id", value)]


@pytest.mark.parametrize(
    "value", [b"x" * (MAX_CLIENT_REQUEST_ID + 1), "café".encode(), b"tab\there", b"nul\x00"]
)
def test_a_client_request_id_that_cannot_be_kept_as_sent_is_refused(value):
    headers: list = []
    with pytest.raises(InvalidRequestError) as refused:
        accept_client_request_id(_scope(value), headers)
    assert refused.value.status == 400 and refused.value.code == "invalid_value"
    assert headers == []  # nothing to answer back


def test_without_one_there_is_none():
    headers: list = []
    assert accept_client_request_id({"headers": []}, headers) == ""
    assert headers == []


def test_the_worker_starts_vllm_answering_request_ids(tmp_path):
    command = EngineConfig(
        model="m", served_model_name="m", host="127.0.0.1", port=8100, run_dir=tmp_path
    ).command()
    assert "--enable-request-id-headers" in command


def test_vllm_takes_our_request_id_for_its_own(platform):
    """vLLM names a completion after its request id (`chatcmpl-<id>`): ours, from the header."""
    reply = call(
        "POST", platform.api_url + "/chat/completions", key=platform.api_key, json_body=BODY
    )
    assert reply.status == 200, reply.body
    request_id = reply.headers["x-request-id"]
    assert request_id.startswith("req_")
    assert reply.json()["id"] == f"chatcmpl-{request_id}"


def test_a_streams_chunks_carry_our_request_id_too(platform):
    request = urllib.request.Request(
        platform.api_url + "/chat/completions",
        data=json.dumps({**BODY, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {platform.api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        request_id = response.headers["x-request-id"]
        ids = {
            json.loads(line[len(b"data: ") :])["id"]
            for line in response
            if line.startswith(b"data: {")
        }
    assert ids == {f"chatcmpl-{request_id}"}


def test_a_client_request_id_is_answered_and_recorded(platform, committed):
    mine = "checkout-7f3a/attempt 2"
    reply = call(
        "POST",
        platform.api_url + "/chat/completions",
        key=platform.api_key,
        json_body=BODY,
        headers={"X-Client-Request-Id": mine},
    )
    assert reply.status == 200, reply.body
    assert reply.headers["x-client-request-id"] == mine
    request_id = reply.headers["x-request-id"]
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what="the usage record",
    )
    assert record.client_request_id == mine


@pytest.mark.parametrize("value", ["x" * (MAX_CLIENT_REQUEST_ID + 1), "café"])
def test_a_bad_client_request_id_is_refused(platform, value):
    reply = call(
        "POST",
        platform.api_url + "/chat/completions",
        key=platform.api_key,
        json_body=BODY,
        headers={"X-Client-Request-Id": value},
    )
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert "X-Client-Request-Id" in error["message"]
    assert reply.headers["x-request-id"].startswith("req_")  # ours, as on every answer
    assert "x-client-request-id" not in reply.headers
