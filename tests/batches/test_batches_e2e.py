"""Batches end to end, with OpenAI's own client against the running platform (gateways, the
main Celery worker draining usage, a batch worker on the `batches` queue, real vLLM workers):
files uploaded, batches validated and run through the pipeline, output and error files as
OpenAI writes them, cancellation, a batch worker killed mid-batch, billing at the batch price."""

from __future__ import annotations

import io
import json
import signal

import openai
import pytest

from apps.batches.models import Batch
from apps.billing.models import Price, UsageRecord
from apps.billing.money import Rates, to_micros
from apps.keys.ratelimit import Once
from dmxplatform.redis_client import request_redis
from tests.conftest import EMBED_MODEL, TINY_CONTEXT
from tests.gateway.test_bad_input import assert_body_timed_out
from tests.gateway.test_errors import assert_error
from tests.http import call, stalled
from tests.keys.factories import make_api_key, make_tenant
from tests.stack import _kill_group, wait_for

MODEL = "dmx-tiny"
FINISHED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def batch_worker(platform):
    worker = platform.stack.start_batch_worker()
    yield worker
    worker.stop()


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


def chat_line(custom_id: str, text: str, tokens: int = 4, model: str = MODEL) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens,
            "ignore_eos": True,
        },
    }


def upload(client: openai.OpenAI, lines: list) -> str:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    return client.files.create(file=("input.jsonl", io.BytesIO(text.encode())), purpose="batch").id


def running(client: openai.OpenAI, lines: list, *, answered: int):
    """A batch of chat completions, once `answered` of its lines are."""
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(
        lambda: client.batches.retrieve(batch.id).request_counts.completed >= answered,
        timeout=120,
        what=f"{answered} lines answered",
    )
    return batch


def ended(client: openai.OpenAI, batch_id: str, timeout: float = 240):
    return wait_for(
        lambda: (b := client.batches.retrieve(batch_id)).status in FINISHED and b,
        timeout=timeout,
        interval=0.5,
        what=f"batch {batch_id} to end",
    )


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def batch_records(batch_id: str, request_ids: set[str]) -> list[UsageRecord]:
    """The batch's usage records, once the ledger holds those of `request_ids`."""

    def stored():
        rows = list(UsageRecord.objects.filter(batch_id=batch_id))
        return request_ids <= {row.request_id for row in rows} and rows

    return wait_for(stored, timeout=30, what=f"the usage records of {batch_id}")


def answered_ids(lines: list[dict]) -> set[str]:
    """The requests that answered an output or error file's lines (not those never run)."""
    return {line["response"]["request_id"] for line in lines if line["response"]}


def test_a_mixed_batch_answers_every_good_line_once_and_every_bad_line_in_the_error_file(
    client, batch_worker, embed_worker, committed
):
    lines: list = []
    for i in range(500):
        kind = i % 5
        if kind in (0, 1):
            lines.append(chat_line(f"chat-{i}", f"Item {i}: say something."))
        elif kind == 2:
            lines.append(
                {
                    "custom_id": f"completion-{i}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": MODEL, "prompt": f"Number {i} is", "max_tokens": 4},
                }
            )
        elif kind == 3:
            lines.append(
                {
                    "custom_id": f"response-{i}",
                    "method": "POST",
                    "url": "/v1/responses",
                    "body": {"model": MODEL, "input": f"Line {i}", "max_output_tokens": 4},
                }
            )
        else:
            lines.append(
                {
                    "custom_id": f"embedding-{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"model": EMBED_MODEL, "input": f"text {i}"},
                }
            )
    bad = {
        "unknown-model": chat_line("unknown-model", "Hi", model="no-such-model"),
        "chat-0": chat_line("chat-0", "a second line with a custom_id used before"),
        "wrong-method": {**chat_line("wrong-method", "Hi"), "method": "GET"},
        "over-context": chat_line("over-context", "word " * (TINY_CONTEXT * 2)),
        "no-body": {"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"},
    }
    lines.extend(bad.values())
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"purpose": "e2e"},
    )
    assert batch.status == "validating" and batch.metadata == {"purpose": "e2e"}

    batch = ended(client, batch.id)

    assert batch.status == "completed", batch
    assert batch.request_counts.total == 505
    assert (batch.request_counts.completed, batch.request_counts.failed) == (500, 5)
    output = read_jsonl(client, batch.output_file_id)
    errors = read_jsonl(client, batch.error_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(
        line["custom_id"] for line in lines[:500]
    )
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in output)
    objects = {o["custom_id"].split("-")[0]: o["response"]["body"]["object"] for o in output}
    assert objects == {
        "chat": "chat.completion",
        "completion": "text_completion",
        "response": "response",
        "embedding": "list",
    }
    by_id = {e["custom_id"]: e for e in errors}
    assert len(errors) == 5 and set(by_id) == set(bad)
    assert by_id["unknown-model"]["response"]["status_code"] == 404
    assert by_id["over-context"]["response"]["status_code"] == 400
    assert by_id["over-context"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert by_id["chat-0"]["error"]["code"] == "duplicate_custom_id"
    assert by_id["wrong-method"]["error"]["code"] == "invalid_method"
    assert by_id["no-body"]["error"]["code"] == "invalid_body"
    assert "Line 503" in by_id["wrong-method"]["error"]["message"]  # 500 good, then the bad

    # Billed once each, at the batch price: one record per answered line and per line the
    # API refused, each naming the batch.
    answered = answered_ids(output)
    records = batch_records(batch.id, answered | answered_ids(errors))
    assert {r.request_id for r in records if r.status == "ok"} == answered
    chat = next(r for r in records if r.request_id in answered and r.model == MODEL)
    price = Price.objects.filter(model_version__model__name=MODEL).latest("effective_from")
    rates = Rates(
        to_micros(price.input_per_million),
        to_micros(price.cached_input_per_million),
        to_micros(price.output_per_million),
        100 - price.batch_discount_percent,
    )
    full = rates.cost(chat.prompt_tokens, chat.cached_tokens, chat.completion_tokens, 10_000)
    batch_cost = rates.cost(
        chat.prompt_tokens, chat.cached_tokens, chat.completion_tokens, 10_000, batch=True
    )
    assert price.batch_discount_percent == 50 and full > 0
    assert to_micros(chat.cost) == batch_cost < full
    assert batch.usage.input_tokens == sum(r.prompt_tokens for r in records if r.status == "ok")
    assert batch.usage.output_tokens == sum(
        r.completion_tokens for r in records if r.status == "ok"
    )


def test_a_malformed_file_fails_validation_naming_its_line(client, batch_worker):
    lines = [json.dumps(chat_line("a", "Hi")), "{not json", json.dumps(chat_line("b", "Hi"))]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = ended(client, batch.id, timeout=60)
    assert batch.status == "failed"
    assert batch.errors.data[0].code == "invalid_json_line"
    assert batch.errors.data[0].line == 2
    assert "Line 2" in batch.errors.data[0].message


def test_a_cancelled_batch_stops_and_delivers_and_bills_only_what_ran(
    client, batch_worker, committed
):
    lines = [chat_line(f"c-{i}", f"Tell a long story number {i}.", tokens=48) for i in range(200)]
    batch = running(client, lines, answered=5)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")

    batch = ended(client, batch.id)

    assert batch.status == "cancelled" and batch.cancelled_at is not None
    output = read_jsonl(client, batch.output_file_id)
    errors = read_jsonl(client, batch.error_file_id)
    assert 5 <= len(output) < 200
    assert len(output) == batch.request_counts.completed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(o["custom_id"] for o in [*output, *errors]) == sorted(
        line["custom_id"] for line in lines
    )
    records = batch_records(batch.id, answered_ids(output))
    assert {r.request_id for r in records if r.status == "ok"} == answered_ids(output)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_batch_worker_killed_mid_batch_loses_no_line_and_runs_none_twice(
    client, platform, batch_worker, committed
):
    lines = [chat_line(f"k-{i}", f"Write line {i} of a poem.", tokens=24) for i in range(120)]
    batch = running(client, lines, answered=10)
    _kill_group(batch_worker.process.pid, signal.SIGKILL)
    batch_worker.process.wait(timeout=10)
    at_kill = client.batches.retrieve(batch.id).request_counts.completed
    assert at_kill < 120
    batch_worker.start()  # the same Service, a new process

    batch = ended(client, batch.id)

    assert batch.status == "completed"
    output = read_jsonl(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
    records = batch_records(batch.id, answered_ids(output))
    # Billed once each: no line's first try (killed with its worker) left a record behind.
    assert {r.request_id for r in records if r.status == "ok"} == answered_ids(output)
    assert Batch.objects.get(id=batch.id).held_until is None
    # And counted once against the key: each line's settle left the marker a second try of it
    # would find (settle.lua; tests/keys/test_money_rules.py counts with it).
    tenant_id = records[0].tenant_id
    markers = [Once.of(tenant_id, request_id, 0, 0).key for request_id in answered_ids(output)]
    assert request_redis().exists(*markers) == len(markers)


def test_the_openai_sdk_batch_example_runs_as_documented(client, batch_worker, tmp_path):
    """OpenAI's batch guide, as written: upload a .jsonl file, create, poll, read the output."""
    path = tmp_path / "batchinput.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "custom_id": f"request-{n}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": MODEL,
                        "messages": [
                            {"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": "Hello world!"},
                        ],
                        "max_tokens": 8,
                    },
                }
            )
            for n in (1, 2)
        )
    )
    with open(path, "rb") as handle:
        batch_input_file = client.files.create(file=handle, purpose="batch")
    assert batch_input_file.purpose == "batch" and batch_input_file.bytes == path.stat().st_size
    created = client.batches.create(
        input_file_id=batch_input_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"description": "nightly eval job"},
    )
    batch = ended(client, created.id, timeout=120)
    assert batch.status == "completed"
    file_response = client.files.content(batch.output_file_id)
    answers = [json.loads(line) for line in file_response.text.splitlines()]
    assert [a["custom_id"] for a in sorted(answers, key=lambda a: a["custom_id"])] == [
        "request-1",
        "request-2",
    ]
    assert answers[0]["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
    assert created.id in [b.id for b in client.batches.list(limit=100)]
    assert batch_input_file.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.delete(batch_input_file.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch_input_file.id)


def test_bad_calls_get_the_apis_errors_and_another_tenants_ids_are_not_found(platform, committed):
    """Hostile and mistaken calls to /v1/files and /v1/batches: an error in OpenAI's shape each,
    never a 500 or a closed socket."""
    url, key = platform.api_url, platform.api_key
    assert_error(call("POST", url + "/batches", key=key, raw=b"{not json"), 400, "invalid_request")
    assert_error(call("POST", url + "/batches", key=key, json_body=[1]), 400, "invalid_request")
    assert_error(
        call("POST", url + "/batches", key=key, json_body={"endpoint": "/v1/moderations"}),
        400,
        "unsupported_endpoint",
        "endpoint",
    )
    for limit in ("0", "101", "%C2%B2", "ten"):  # %C2%B2: "²", which str.isdigit() takes
        reply = call("GET", f"{url}/batches?limit={limit}", key=key)
        assert reply.status == 400 and reply.json()["error"]["param"] == "limit", reply.body
    assert_error(call("GET", url + "/batches/batch_nope", key=key), 404, "not_found", "batch_id")
    assert_error(call("PUT", url + "/files", key=key, raw=b""), 405, "method_not_allowed")
    assert_error(call("POST", url + "/files", key=key, raw=b"plain"), 400, "invalid_request")
    assert_error(call("GET", url + "/files", key="sk-dmx-wrong"), 401, "invalid_api_key")
    # Another tenant's key sees none of this tenant's files.
    mine = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    file_id = upload(mine, [chat_line("a", "Hi")])
    _, other = make_api_key(make_tenant())
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        assert call(method, f"{url}/files/{file_id}{path}", key=other).status == 404
    assert call("GET", f"{url}/files/{file_id}", key=key).status == 200


def test_an_upload_that_stops_arriving_is_a_408_and_its_connection_is_closed(platform):
    """A multipart upload that declares a megabyte and sends a few bytes held its connection,
    its task and a temporary file for good (the gateway's prompt bodies had their timeout;
    uploads, read to disk as they come, had none). Nothing was authenticated yet: the key
    signs the body, so anyone could do it."""
    answer, waited = stalled(
        platform.url,
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000\r\n\r\n"
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b\r\n',
    )
    assert_body_timed_out(answer, waited)


def test_an_upload_may_ask_to_expire_sooner_as_openais_files_do(client):
    """`expires_after` (anchor `created_at`, 3,600 s to the retention): the file's
    `expires_at` follows it; a value out of range or not an integer is a 400 naming it."""
    content = ("input.jsonl", io.BytesIO(json.dumps(chat_line("a", "Hi")).encode()))
    soon = client.files.create(
        file=content, purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert soon.expires_at - soon.created_at == 3600
    for seconds in (60, "²"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.files.create(
                file=("input.jsonl", io.BytesIO(b"{}")),
                purpose="batch",
                expires_after={"anchor": "created_at", "seconds": seconds},
            )
        assert refused.value.body["param"].startswith("expires_after"), refused.value.body
