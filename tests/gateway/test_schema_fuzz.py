"""Fuzz /v1 with requests generated from OpenAI's own OpenAPI schema (schemathesis).

The schema is OpenAI's, cut to the operations the gateway serves (openai_schema/, see its
README); its paths are relative to /v1, as they are to https://api.openai.com/v1. Cases come
in schemathesis's positive and negative modes, from the schema's examples, its coverage phase
(boundary values, wrong types, missing fields, other methods) and fuzzing.
Before a case is sent, what would make the tiny model generate for long is capped (max_tokens
and max_completion_tokens at 8, max_tokens set to 8 when neither is given; n and best_of at 2),
and in about half of the cases `model` is forced to one the e2e stack serves, so that they reach
the engine instead of ending in a 404; the rest of the body is sent as generated, `stream`
included.

Checked on every response: no server error (a 503 with Retry-After is load shedding, allowed;
any other 5xx fails), and every error has OpenAI's shape, as does an error event in a stream.
Afterwards the usage ledger must still drain, with nothing parked in its dead-letter stream.
Failures the fuzzing found are kept in FOUND and replayed on every run.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from apps.billing import ledger
from dmxplatform.redis_client import sync_redis
from tests.fuzz import ERROR_FIELDS, fuzz_config
from tests.http import call
from tests.stack import wait_for

SCHEMA_PATH = Path(__file__).resolve().parent / "openai_schema" / "openapi.json"
SERVED_MODEL = "dmx-tiny"
# Generated cases per operation in the fuzzing phase; the schema's examples and the coverage
# phase's cases come on top.
MAX_EXAMPLES = 300
MAX_COMPLETION_TOKENS = 8
MAX_SAMPLES = 2  # n, best_of
REQUEST_TIMEOUT = 60  # seconds; a request that hangs longer is a failure
# Deterministic coverage cases come on top: about 1,150 for chat and 250 for text
# completions, nearly all answered with a 400 in milliseconds.
CONFIG = fuzz_config(
    max_examples=MAX_EXAMPLES,
    **{
        # Read a streamed reply to its end: an error event comes last.
        "max-stream-events": 1000,
        # Reproductions must show max_tokens and the like ("token" is masked by default).
        "output": {
            "sanitization": {
                "keys-to-sanitize": ["authorization"],
                "sensitive-markers": ["authorization"],
            }
        },
    },
)
schema = schemathesis.openapi.from_path(SCHEMA_PATH, config=CONFIG)
_RAW = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
ERROR_RESPONSE = jsonschema_rs.validator_for(
    {"$ref": "#/components/schemas/ErrorResponse", "components": _RAW["components"]}
)


def _share(case) -> bool:
    """About half of the cases, chosen by their content: a replay picks the same ones."""
    seen = json.dumps([case.path_parameters, case.body], sort_keys=True, default=repr)
    return zlib.crc32(seen.encode()) % 2 == 0


def _cap(body: dict[str, Any], name: str, ceiling: int) -> None:
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value > ceiling:
        body[name] = ceiling


def bound(case, stored_id: str) -> None:
    """Cap what would make the engine generate for long; point a share of cases at a served
    model, or at a stored response. Everything else stays as generated."""
    force = _share(case)
    if isinstance(case.body, dict):
        body = dict(case.body)
        if force:
            body["model"] = SERVED_MODEL
        # Each API's own bound on what is generated (embeddings generate nothing).
        bounds = (
            ("max_output_tokens",)
            if case.path == "/responses"
            else ()
            if case.path in ("/embeddings", "/responses/input_tokens")
            else ("max_tokens", "max_completion_tokens")
        )
        for name in bounds:
            _cap(body, name, MAX_COMPLETION_TOKENS)
        if bounds and all(body.get(name) is None for name in bounds):
            # Unbounded, the tiny model writes to the end of its context.
            body[bounds[0]] = MAX_COMPLETION_TOKENS
        _cap(body, "n", MAX_SAMPLES)
        _cap(body, "best_of", MAX_SAMPLES)
        case.body = body
    if force and "model" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "model": SERVED_MODEL}
    if force and "response_id" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "response_id": stored_id}


def _error_problems(payload: Any) -> list[str]:
    problems = [error.message for error in ERROR_RESPONSE.iter_errors(payload)]
    if not problems:
        if set(payload) != {"error"}:
            problems.append(f"keys beside 'error': {sorted(set(payload) - {'error'})}")
        if set(payload["error"]) != ERROR_FIELDS:
            problems.append(f"error keys {sorted(payload['error'])}, not {sorted(ERROR_FIELDS)}")
        elif not payload["error"]["message"]:
            problems.append("empty error message")
    return problems


def _stream_error_events(text: str) -> list[str]:
    """The data of each event in an SSE body that carries an error."""
    found = []
    for line in text.splitlines():
        data = line.removeprefix("data:").strip()
        if line.startswith("data:") and data.startswith("{") and '"error"' in data:
            found.append(data)
    return found


def openai_error_shape(ctx, response, case) -> None:
    """An error response is {"error": {"message", "type", "param", "code"}} as OpenAI's; so is
    the data of an error event in a stream."""
    status = response.status_code
    content_type = (response.headers.get("content-type") or [""])[0]
    text = response.content.decode("utf-8", "replace")
    if status < 400:
        if content_type.startswith("text/event-stream"):
            for data in _stream_error_events(text):
                event = json.loads(data)
                if "error" in event:
                    problems = _error_problems(event)
                    assert not problems, f"error event not OpenAI-shaped: {problems}: {data}"
        return
    assert content_type.startswith("application/json"), (
        f"{status} error with content-type {content_type!r}: {text[:500]}"
    )
    try:
        payload = json.loads(response.content)
    except ValueError:
        payload = None
    assert isinstance(payload, dict), f"{status} error body is not a JSON object: {text[:500]}"
    problems = _error_problems(payload)
    assert not problems, f"{status} error not OpenAI-shaped: {problems}: {text[:500]}"


def _load_shed(response) -> bool:
    return response.status_code == 503 and bool(response.headers.get("retry-after"))


@pytest.fixture(scope="module")
def dead_letters_before(platform) -> str:
    """The id of the last entry parked in the ledger's dead-letter stream before the fuzzing."""
    last = sync_redis().xrevrange(ledger.USAGE_STREAM.shard(0).dead_letter_key(), count=1)
    return last[0][0].decode() if last else "0-0"


@pytest.fixture(scope="module")
def stored_id(platform) -> str:
    """A stored response for the cases on /responses/{response_id} to read, page, cancel and
    delete (after which they read a 404)."""
    reply = call(
        "POST",
        platform.api_url + "/responses",
        key=platform.api_key,
        json_body={"model": SERVED_MODEL, "input": "Hi", "max_output_tokens": 4},
    )
    return reply.json()["id"]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    # Shrinking a failure would resend hundreds of requests: report the first one as found.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_openai_schema(case, platform, dead_letters_before, stored_id):
    bound(case, stored_id)
    send_and_check(case, platform)


def send_and_check(case, platform) -> None:
    response = case.call(
        base_url=platform.api_url,
        headers={"Authorization": f"Bearer {platform.api_key}"},
        timeout=REQUEST_TIMEOUT,
    )
    checks = [openai_error_shape]
    if not _load_shed(response):
        checks.append(not_a_server_error)
    case.validate_response(response, checks=checks)


# What the fuzzing has found, minimised, sent on every run through the same checks: so that the
# module fails until each is fixed, not only when the generator happens on it again.
FOUND = [
    # vLLM refuses the empty prompt after the stream has begun; its error event is relayed
    # as vLLM wrote it ("type": "BadRequestError", "code": 400, an integer).
    pytest.param(
        "/completions",
        {"model": SERVED_MODEL, "prompt": ["hi", ""], "stream": True, "max_tokens": 8},
        id="completions-stream-empty-prompt-in-a-list",
    ),
    # The same on chat: a token id outside the vocabulary in logit_bias.
    pytest.param(
        "/chat/completions",
        {
            "model": SERVED_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "logit_bias": {"999999": 1},
            "max_tokens": 8,
        },
        id="chat-stream-logit-bias-out-of-vocabulary",
    ),
    # An encoding format that is no string (unhashable: the set lookup raised a TypeError).
    pytest.param(
        "/embeddings",
        {"model": SERVED_MODEL, "input": "The quick brown fox", "encoding_format": {}},
        id="embeddings-encoding-format-an-object",
    ),
    # The same for a Responses input message's role.
    pytest.param(
        "/responses",
        {"model": SERVED_MODEL, "input": [{"role": {}, "content": "hi"}], "max_output_tokens": 8},
        id="responses-input-role-an-object",
    ),
]


@pytest.mark.parametrize(("path", "body"), FOUND)
def test_found_by_fuzzing(platform, dead_letters_before, path, body):
    send_and_check(schema[path]["POST"].Case(body=body), platform)


def test_usage_ledger_still_drains(platform, dead_letters_before):
    client = sync_redis()
    wait_for(
        lambda: client.xlen(ledger.USAGE_STREAM.shard(0).key()) == 0,
        timeout=30,
        interval=0.25,
        what="the usage stream to drain after the fuzzing",
    )
    dead_key = ledger.USAGE_STREAM.shard(0).dead_letter_key()
    parked = client.xrange(dead_key, min=f"({dead_letters_before}")
    assert not parked, f"usage entries parked in {dead_key}: {parked[:5]}"
