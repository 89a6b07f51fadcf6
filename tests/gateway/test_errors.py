"""Every error the API returns: status, OpenAI shape, stable code; never a 500 for bad input."""

from __future__ import annotations

import pytest

from apps.keys.services import api_key_revoke
from tests.conftest import TINY_CONTEXT, UNSERVED_MODEL
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

CHAT = "/chat/completions"


def assert_error(reply, status: int, code: str, param: str | None = None) -> dict:
    assert reply.status == status, reply.body
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-request-id"].startswith("req_")
    body = reply.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    return error


def chat(platform, body=None, *, key=None, raw=None):
    return call(
        "POST",
        platform.api_url + CHAT,
        key=platform.api_key if key is None else key,
        json_body=body,
        raw=raw,
    )


def hello(model="dmx-tiny", **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }


def test_missing_key_is_401(platform):
    reply = call("POST", platform.api_url + CHAT, json_body=hello())
    error = assert_error(reply, 401, "invalid_api_key")
    assert error["type"] == "invalid_request_error"
    assert reply.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "key",
    [
        "not-a-key",
        "sk-dmx-abcdefgh_wrongsecret",  # well-formed, unknown id
        "Basic dXNlcjpwYXNz",
    ],
)
def test_bad_key_is_401(platform, key):
    assert_error(chat(platform, hello(), key=key), 401, "invalid_api_key")


def test_right_id_wrong_secret_is_401_and_not_echoed(platform, committed):
    _, plaintext = make_api_key()
    forged = plaintext[: len("sk-dmx-") + 8] + "_" + "x" * 32
    reply = chat(platform, hello(), key=forged)
    assert_error(reply, 401, "invalid_api_key")
    assert forged.encode() not in reply.body and plaintext.encode() not in reply.body


def test_revoked_key_is_refused_within_a_second(platform, committed):
    key, plaintext = make_api_key()
    assert call("GET", platform.api_url + "/models", key=plaintext).status == 200  # now cached
    api_key_revoke(key=key)
    reply = wait_for(
        lambda: (r := call("GET", platform.api_url + "/models", key=plaintext)).status == 401 and r,
        timeout=1.0,
        interval=0.05,
        what="revocation to reach the gateway",
    )
    assert_error(reply, 401, "api_key_revoked")


def test_unknown_model_is_404(platform):
    assert_error(chat(platform, hello("no-such-model")), 404, "model_not_found", "model")


def test_model_the_key_may_not_use_is_404(platform, committed):
    _, plaintext = make_api_key(allowed_models=["dmx-tiny-b"])
    assert_error(chat(platform, hello("dmx-tiny"), key=plaintext), 404, "model_not_found", "model")
    models = call("GET", platform.api_url + "/models", key=plaintext).json()["data"]
    assert [m["id"] for m in models] == ["dmx-tiny-b"]


def test_bad_json_is_400(platform):
    assert_error(chat(platform, raw=b'{"model": "dmx-tiny", "messages": ['), 400, "invalid_json")
    assert_error(chat(platform, raw=b"[1, 2]"), 400, "invalid_type")
    assert_error(chat(platform, raw=b"\xff\xfe"), 400, "invalid_json")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "missing_required_parameter", "model"),
        ({"model": "dmx-tiny"}, "missing_required_parameter", "messages"),
        ({"model": "dmx-tiny", "messages": []}, "invalid_type", "messages"),
        ({"model": "dmx-tiny", "messages": ["hi"]}, "invalid_type", "messages[0]"),
        (
            {"model": "dmx-tiny", "messages": [{"role": "wizard", "content": "x"}]},
            "invalid_value",
            "messages[0].role",
        ),
        (
            {"model": "dmx-tiny", "messages": [{"role": "user", "content": 5}]},
            "invalid_type",
            "messages[0].content",
        ),
        ({**hello(), "max_tokens": 0}, "invalid_value", "max_tokens"),
        ({**hello(), "max_tokens": "ten"}, "invalid_type", "max_tokens"),
        ({**hello(), "temperature": 3}, "invalid_value", "temperature"),
        ({**hello(), "stream": "yes"}, "invalid_type", "stream"),
        ({**hello(), "stream_options": {"include_usage": True}}, "invalid_value", "stream_options"),
        ({**hello(), "n": 0}, "invalid_value", "n"),
        ({**hello(), "model": 42}, "invalid_type", "model"),
    ],
)
def test_schema_errors_are_400(platform, body, code, param):
    assert_error(chat(platform, body), 400, code, param)


def test_completions_prompt_schema(platform):
    url = platform.api_url + "/completions"
    reply = call(
        "POST", url, key=platform.api_key, json_body={"model": "dmx-tiny", "prompt": [1.5]}
    )
    assert_error(reply, 400, "invalid_type", "prompt")
    reply = call("POST", url, key=platform.api_key, json_body={"model": "dmx-tiny"})
    assert_error(reply, 400, "missing_required_parameter", "prompt")


def test_prompt_longer_than_context_is_400(platform):
    long_text = "hello world " * TINY_CONTEXT  # two or more tokens per repetition
    reply = chat(platform, hello(messages=[{"role": "user", "content": long_text}]))
    error = assert_error(reply, 400, "context_length_exceeded", "messages")
    assert f"maximum context length is {TINY_CONTEXT} tokens" in error["message"]


def test_prompt_plus_max_tokens_over_context_is_400(platform):
    reply = chat(platform, hello(max_tokens=TINY_CONTEXT))
    error = assert_error(reply, 400, "context_length_exceeded", "messages")
    assert "in the completion" in error["message"]


def test_vllm_validation_errors_come_back_in_our_shape(platform):
    # The gateway does not check logprobs' range; vLLM does, and its error is translated.
    reply = chat(platform, hello(logprobs=True, top_logprobs=10_000))
    assert_error(reply, 400, "invalid_value", "logprobs")


def test_model_without_a_live_node_is_503_with_retry_after(platform):
    reply = chat(platform, hello(UNSERVED_MODEL))
    assert_error(reply, 503, "no_capacity")
    assert int(reply.headers["retry-after"]) >= 1


def test_unknown_path_and_wrong_method(platform):
    assert_error(
        call("GET", platform.api_url + "/embeddingz", key=platform.api_key), 404, "not_found"
    )
    reply = call("GET", platform.api_url + CHAT, key=platform.api_key)
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == "POST"


def test_oversized_body_is_413(platform):
    reply = chat(platform, raw=b'{"model": "' + b"x" * (9 * 1024 * 1024) + b'"}')
    assert_error(reply, 413, "request_too_large")
