"""The Responses API over a WebSocket (wss://…/v1/responses), with OpenAI's own client's
connection and a bare `websockets` client, against the running platform."""

from __future__ import annotations

import json

import openai
import pytest
from websockets.sync.client import connect

from apps.billing.models import UsageRecord
from tests.gateway.test_openai_client import usage_row
from tests.gateway.test_stored_responses import request_id_of
from tests.stack import wait_for

MODEL = "dmx-tiny"
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def until_terminal(connection) -> list:
    events = []
    for event in connection:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the socket closed before the response ended")


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


def test_responses_over_a_socket_stream_chain_and_bill(client, committed):
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL, input="My name is Ada.", max_output_tokens=6, stream_id="talk"
        )
        first = until_terminal(connection)
        assert [event.sequence_number for event in first] == list(range(len(first)))
        assert {getattr(event, "stream_id", None) for event in first} == {"talk"}
        done = first[-1].response
        assert first[-1].type == "response.incomplete" and done.usage.output_tokens == 6
        # The next turn on the same socket, continuing the stored response.
        connection.response.create(
            model=MODEL, input="And my name?", max_output_tokens=3, previous_response_id=done.id
        )
        second = until_terminal(connection)[-1].response
    assert second.previous_response_id == done.id
    assert second.usage.input_tokens > done.usage.input_tokens + 6
    for response in (done, second):
        record = usage_row(request_id_of(response.id))
        assert (record.prompt_tokens, record.completion_tokens) == (
            response.usage.input_tokens,
            response.usage.output_tokens,
        )
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_bad_events_are_error_events_and_the_socket_stays(platform):
    url = platform.api_url.replace("http://", "ws://") + "/responses"
    with connect(url, additional_headers={"Authorization": f"Bearer {platform.api_key}"}) as ws:
        for sent, param in (
            ("not json", "type"),
            (json.dumps({"type": "response.steer", "input": "x"}), "type"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "x",
                         "background": True}), "background"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "x",
                         "max_output_tokens": 0, "stream_id": "lane"}), "max_output_tokens"),
        ):  # fmt: skip
            ws.send(sent)
            error = json.loads(ws.recv(timeout=30))
            assert (error["type"], error["status"], error["error"]["param"]) == (
                "error",
                400,
                param,
            )
        assert error["stream_id"] == "lane"  # the refused request's lane
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Hi",
                            "max_output_tokens": 2}))  # fmt: skip
        assert json.loads(ws.recv(timeout=30))["type"] == "response.created"


def test_frames_that_are_no_json_object_of_text_are_answered_too(platform):
    url = platform.api_url.replace("http://", "ws://") + "/responses"
    with connect(url, additional_headers={"Authorization": f"Bearer {platform.api_key}"}) as ws:
        for frame in (b"\x00\x01", "", "[1, 2]"):
            ws.send(frame)
            error = json.loads(ws.recv(timeout=30))
            assert (error["type"], error["status"]) == ("error", 400), frame
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Hi",
                            "max_output_tokens": 2}))  # fmt: skip
        assert json.loads(ws.recv(timeout=30))["type"] == "response.created"


@pytest.mark.parametrize("kind", ["bad key", "signing key", "fenced key"])
def test_a_socket_without_a_key_it_may_use_gets_an_error_and_is_closed(platform, committed, kind):
    from apps.keys.services import api_key_signing_enable
    from tests.keys.factories import make_api_key

    if kind == "bad key":
        secret, status = "dmx-nope", 401
    elif kind == "signing key":
        key, secret = make_api_key(name="signs")
        api_key_signing_enable(key=key)
        status = 401  # signature_required: a socket's events carry no signatures
    else:
        _, secret = make_api_key(name="fenced", allowed_networks=["10.9.8.0/24"])
        status = 403
    url = platform.api_url.replace("http://", "ws://") + "/responses"
    with connect(url, additional_headers={"Authorization": f"Bearer {secret}"}) as ws:
        error = json.loads(ws.recv(timeout=30))
        assert (error["type"], error["status"]) == ("error", status)
        with pytest.raises(Exception, match="1008"):
            ws.recv(timeout=30)


def test_a_client_that_leaves_stops_its_response_and_pays_what_it_made(platform, committed):
    url = platform.api_url.replace("http://", "ws://") + "/responses"
    with connect(url, additional_headers={"Authorization": f"Bearer {platform.api_key}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Count.",
                            "max_output_tokens": 1500, "ignore_eos": True}))  # fmt: skip
        created = json.loads(ws.recv(timeout=60))
        while json.loads(ws.recv(timeout=60))["type"] != "response.output_text.delta":
            pass
    record = wait_for(
        lambda: UsageRecord.objects.filter(
            request_id=request_id_of(created["response"]["id"])
        ).first(),
        timeout=30,
        what="the left response's usage record",
    )
    assert record.status == "client_disconnected" and 0 < record.completion_tokens < 1500
