"""Hostile and unlucky input through the real gateway: each used to end in a 500, a hang, a
silently ignored field or a usage record the database could not store."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from apps.billing.models import UsageRecord
from tests.gateway.test_errors import assert_error, chat, hello
from tests.http import call, stalled
from tests.stack import wait_for


@pytest.mark.parametrize("text", [5, None, ["hi"]])
@pytest.mark.parametrize("role", ["user", "system"])
def test_a_content_part_whose_text_is_not_a_string_is_400(platform, role, text):
    messages = [{"role": role, "content": [{"type": "text", "text": text}]}]
    if role == "system":
        messages.append({"role": "user", "content": "hi"})
    assert_error(
        chat(platform, hello(messages=messages)), 400, "invalid_type", "messages[0].content[0].text"
    )


@pytest.mark.parametrize("depth", [255, 600, 1023])
def test_json_nested_deep_is_400_not_500(platform, depth):
    body = b'{"model": "dmx-tiny", "messages": [{"role": "user", "content": "hi"}], "x": '
    body += b"[" * depth + b"]" * depth + b"}"
    assert_error(chat(platform, raw=body), 400, "invalid_json")


def test_booleans_are_not_token_ids(platform):
    reply = call(
        "POST",
        platform.api_url + "/completions",
        key=platform.api_key,
        json_body={"model": "dmx-tiny", "prompt": [[True, False]], "max_tokens": 2},
    )
    assert_error(reply, 400, "invalid_type", "prompt")


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("functions", [{"name": "f", "parameters": {"type": "object"}}], "unsupported_parameter"),
        ("store", True, "unsupported_value"),
        ("metadata", {"order": "42"}, "unsupported_parameter"),
        ("service_tier", "flex", "unsupported_value"),
        ("prediction", {"type": "content", "content": "hello"}, "unsupported_parameter"),
    ],
)
def test_fields_that_would_be_ignored_are_refused_by_name(platform, field, value, code):
    assert_error(chat(platform, hello(**{field: value})), 400, code, field)


def test_fields_the_engine_honours_are_accepted(platform):
    reply = chat(platform, hello(parallel_tool_calls=False, reasoning_effort="low"))
    assert reply.status == 200, reply.body


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("dmx\x00tiny", "dmx\\x00tiny"),
        ("m" * 500, "m" * 128),
        ("\u202eevil\u200b", "\\u202eevil\\u200b"),
    ],
)
def test_a_model_name_as_asked_is_recorded_escaped_and_cut(platform, committed, name, stored):
    """Such a name used to make a usage event PostgreSQL refuses, which stopped the ledger."""
    reply = chat(platform, hello(name))
    error = assert_error(reply, 404, "model_not_found", "model")
    assert "\x00" not in error["message"] and len(error["message"]) < 300
    request_id = reply.headers["x-request-id"]
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=15,
        what="the 404's usage record",
    )
    assert record.model == stored
    assert record.http_status == 404


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (b'{"model": "dmx-tiny"}', 400),
        (b'{"model": "dmx-tiny", "messages": "hi"}', 400),
        (b'{"model": "dmx-tiny", "messages": [{"role": "robot", "content": "x"}]}', 400),
        (b'{"model": "dmx-tiny", "messages": [{"role": "user", "content": [{"type": 5}]}]}', 400),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400),
        (
            b'{"model": "dmx-tiny", "messages": [{"role": "user", "content": "x"}], "system": 3}',
            400,
        ),
        (b"[" * 2000 + b"]" * 2000, 400),
    ],
)
def test_count_tokens_answers_bad_bodies_in_anthropics_shape(platform, body, status):
    reply = call(
        "POST",
        platform.url + "/v1/messages/count_tokens",
        headers={"x-api-key": platform.api_key, "Content-Type": "application/json"},
        raw=body,
    )
    assert reply.status == status, reply.body[:300]
    error = reply.json()
    assert error["type"] == "error" and error["error"]["message"]
    assert reply.headers["request-id"] == reply.headers["x-request-id"]


def _raw_post(url: str, path: str, authorization: bytes, body: bytes = b"{}") -> tuple[int, dict]:
    """POST with header bytes no UTF-8 decoder accepts (http.client sends str as Latin-1)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("POST", path)
        connection.putheader("Authorization", authorization.decode("latin-1"))
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    "path",
    [
        "/internal/v1/nodes/register",
        "/internal/v1/nodes/1/heartbeat",
        "/v1/chat/completions",
    ],
)
def test_authorization_bytes_that_are_not_utf8_are_a_401(platform, path):
    status, body = _raw_post(platform.url, path, b"Bearer dmx-node-\xff\xfe\xfd_\xc3\x28")
    assert status == 401
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_a_body_that_stops_arriving_is_a_408(platform):
    """A client that declares 1,000 bytes and sends 20 used to hold its connection for good."""
    answer, waited = stalled(
        platform.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + platform.api_key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        b'{"model": "dmx-tin',
    )
    assert_body_timed_out(answer, waited)


def assert_body_timed_out(answer: bytes, waited: float) -> None:
    """A 408 came, and the connection closed, once the body had not arrived for
    DMX_BODY_READ_TIMEOUT_SECONDS."""
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer
    limit = settings.DMX_BODY_READ_TIMEOUT_SECONDS
    # The server's clock starts when the headers arrive, a moment before the client's.
    assert limit - 0.5 <= waited < limit + 5


def test_a_prompt_of_megabytes_is_refused_from_its_length(platform):
    """Far past the context: refused before the tokenizer is asked (the message says 'at
    least'), where it used to be screened, classified and tokenized on the event loop."""
    prompt = "lorem ipsum dolor sit amet " * 290_000  # 7.8 MB
    reply = chat(platform, hello(messages=[{"role": "user", "content": prompt}]))
    error = assert_error(reply, 400, "context_length_exceeded", "messages")
    assert "you requested at least" in error["message"]
    # The gateway still answers everyone else.
    assert chat(platform, hello()).status == 200


def test_a_stream_the_engine_refuses_gets_its_status_in_openai_shape(platform):
    """vLLM refuses some requests only once streaming (an out-of-vocabulary logit_bias): its
    event used to reach the client as is (type BadRequestError, an integer code) under a 200."""
    body = hello(stream=True, logit_bias={"999999": 1})
    error = assert_error(chat(platform, body), 400, "invalid_value", "logit_bias")
    assert error["type"] == "invalid_request_error"


def test_refused_streams_do_not_open_the_nodes_breakers(platform):
    """They counted as node failures: six of them took dmx-tiny away from every tenant."""
    for _ in range(2 * settings.DMX_BREAKER_FAILURES):
        assert chat(platform, hello(stream=True, logit_bias={"999999": 1})).status == 400
    for _ in range(4):
        assert chat(platform, hello()).status == 200
