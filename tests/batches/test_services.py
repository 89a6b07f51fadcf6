"""Batches' services against PostgreSQL and the file storage: validation of the input file, a
line's answer recorded, the hold a worker takes, and the output and error files."""

from __future__ import annotations

import json
from datetime import timedelta

import orjson
import pytest
from django.utils import timezone

from apps.batches import services
from apps.batches.choices import BatchStatus, LineState
from apps.batches.models import Batch, BatchLine
from apps.batches.selectors import batches_page, file_get
from dmxplatform.errors import ConflictError, InvalidRequestError, NotFoundError
from tests.batches.factories import create_arguments, make_batch, request_line, validated_batch
from tests.keys.factories import make_api_key, make_tenant

pytestmark = pytest.mark.django_db


def states(batch) -> dict[int, tuple[str, str, str | None]]:
    return {
        line.index: (line.custom_id, line.state, (line.error or {}).get("code"))
        for line in BatchLine.objects.filter(batch=batch)
    }


def test_validation_keeps_bad_lines_for_the_error_file_and_runs_the_rest():
    batch = validated_batch(
        [
            request_line("a"),
            request_line("b", url="/v1/embeddings"),  # another endpoint: a line may name its own
            request_line("a", text="again"),
            request_line("c", method="GET"),
            request_line("d", url="/v1/images/generations"),
            request_line("e", body=["not", "an", "object"]),
            {"method": "POST", "url": "/v1/chat/completions", "body": {}},
            "",  # blank lines are skipped, and keep the numbering of the file
            "[1, 2]",
        ]
    )
    assert batch.status == BatchStatus.IN_PROGRESS and batch.in_progress_at is not None
    assert (batch.total, batch.failed, batch.model) == (8, 6, "m")
    assert states(batch) == {
        1: ("a", LineState.PENDING, None),
        2: ("b", LineState.PENDING, None),
        3: ("a", LineState.FAILED, "duplicate_custom_id"),
        4: ("c", LineState.FAILED, "invalid_method"),
        5: ("d", LineState.FAILED, "invalid_url"),
        6: ("e", LineState.FAILED, "invalid_body"),
        7: ("", LineState.FAILED, "missing_custom_id"),
        9: ("", LineState.FAILED, "invalid_request"),
    }


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ([json.dumps(request_line("a")), '{"custom_id": "b",'], "invalid_json_line", 2),
        (["", "   "], "empty_file", None),
        ([json.dumps(request_line(str(i))) for i in range(3)], "too_many_requests", 3),
    ],
)
def test_a_file_that_is_no_batch_fails_it_naming_the_line(settings, lines, code, line):
    settings.DMX_BATCH_MAX_LINES = 2
    batch = validated_batch(lines)
    assert batch.status == BatchStatus.FAILED and batch.failed_at is not None
    [error] = batch.errors["data"]
    assert (error["code"], error["line"]) == (code, line)
    if line:
        assert f"ine {line}" in error["message"]
    assert not BatchLine.objects.filter(batch=batch).exists()


def test_creating_a_batch_checks_its_arguments_and_the_tenants_file():
    key, _ = make_api_key()
    other, _ = make_api_key(make_tenant())
    batch = make_batch([request_line("a")], key)
    arguments = create_arguments(key, batch.input_file_id)
    with pytest.raises(InvalidRequestError, match="endpoint"):
        services.batch_create(**{**arguments, "endpoint": "/v1/moderations"})
    with pytest.raises(InvalidRequestError, match="completion_window"):
        services.batch_create(**{**arguments, "completion_window": "1h"})
    with pytest.raises(InvalidRequestError, match="metadata"):
        services.batch_create(**{**arguments, "metadata": {"k": 1}})
    with pytest.raises(NotFoundError):  # another tenant's file is no file
        services.batch_create(**{**arguments, "tenant_id": other.tenant_id})
    with pytest.raises(NotFoundError):
        file_get(batch.input_file_id, other.tenant_id)


def claimed(batch, count=10):
    return {line.custom_id: line for line in services.lines_claim(batch, count)}


def test_a_line_is_answered_once_and_its_tokens_counted(settings):
    settings.DMX_BATCH_MAX_ATTEMPTS = 2
    batch = validated_batch(
        [request_line("ok"), request_line("busy"), request_line("broken"), request_line("bad")]
    )
    lines = claimed(batch)
    assert set(lines) == {"ok", "busy", "broken", "bad"}
    assert claimed(batch) == {}  # running lines are nobody else's
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    services.line_record(lines["ok"], services.Outcome(200, orjson.dumps({"usage": usage})))
    services.line_record(
        lines["ok"], services.Outcome(200, orjson.dumps({"usage": usage}))
    )  # again
    services.line_record(lines["busy"], services.Outcome(503, orjson.dumps({}), retry_after=30))
    services.line_record(lines["broken"], services.Outcome(502, orjson.dumps({})))
    services.line_record(
        lines["bad"], services.Outcome(404, orjson.dumps({"error": {"code": "x"}}))
    )
    rows = {line.custom_id: line for line in BatchLine.objects.filter(batch=batch)}
    assert (rows["ok"].state, rows["ok"].request_id) == (LineState.DONE, lines["ok"].request_id)
    assert len({line.request_id for line in lines.values()}) == 4  # each try its own id
    # No room: it waits, and waiting is no failed try.
    assert rows["busy"].state == LineState.PENDING and rows["busy"].attempts == 0
    assert rows["busy"].not_before > timezone.now() + timedelta(seconds=25)
    assert rows["broken"].state == LineState.PENDING and rows["broken"].attempts == 1
    assert rows["bad"].state == LineState.FAILED and rows["bad"].status_code == 404
    # Its next try comes due; the engine fails it again: its last, to the error file.
    assert rows["broken"].not_before > timezone.now()
    BatchLine.objects.filter(id=rows["broken"].id).update(not_before=timezone.now())
    [again] = services.lines_claim(batch, 10)
    assert again.custom_id == "broken"
    assert again.request_id != lines["broken"].request_id  # a new try: a new request
    services.line_record(
        again, services.Outcome(502, orjson.dumps({"error": {"code": "upstream"}}))
    )
    assert BatchLine.objects.get(id=again.id).state == LineState.FAILED
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (1, 2)
    assert (batch.input_tokens, batch.cached_tokens, batch.output_tokens) == (7, 2, 3)


def test_one_worker_holds_a_batch_and_another_takes_it_over_once_the_hold_lapses():
    batch = validated_batch([request_line("a"), request_line("b")])
    held = services.batch_hold()
    assert held.id == batch.id
    assert services.batch_hold() is None  # held
    [lost] = services.lines_claim(held, 1)
    assert BatchLine.objects.filter(batch=batch, state=LineState.RUNNING).count() == 1
    later = timezone.now() + timedelta(seconds=3600)
    taken = services.batch_hold(now=later)  # the first holder was lost
    assert taken.id == batch.id
    # The lost holder's line goes again, as the same try under the same request id: should
    # the lost try have settled, the ledger keeps one record of the two (its drain stores a
    # request id once).
    assert BatchLine.objects.filter(batch=batch, state=LineState.PENDING).count() == 2
    again = {line.index: line for line in services.lines_claim(taken, 2)}
    assert (again[lost.index].request_id, again[lost.index].attempts) == (lost.request_id, 1)


def output_of(file) -> list[dict]:
    with file.content.open("rb") as handle:
        return [json.loads(line) for line in handle]


def test_a_cancelled_batch_delivers_what_ran_and_lists_the_rest_as_not_run():
    batch = validated_batch(
        [request_line("a"), request_line("b"), request_line("c"), request_line("a")]
    )
    lines = claimed(batch, 1)
    services.line_record(lines["a"], services.Outcome(200, orjson.dumps({"id": "chatcmpl-1"})))
    services.batch_cancel(batch.id, batch.tenant_id)
    batch.refresh_from_db()
    assert services.batch_end(batch) == BatchStatus.CANCELLED
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED and batch.cancelled_at is not None
    [answer] = output_of(batch.output_file)
    assert answer["custom_id"] == "a" and answer["error"] is None
    assert answer["response"] == {
        "status_code": 200,
        "request_id": lines["a"].request_id,
        "body": {"id": "chatcmpl-1"},
    }
    errors = output_of(batch.error_file)
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("b", None, "batch_cancelled"),
        ("c", None, "batch_cancelled"),
        ("a", None, "duplicate_custom_id"),
    ]
    assert batch.output_file.purpose == "batch_output"
    with pytest.raises(ConflictError):
        services.batch_cancel(batch.id, batch.tenant_id)


def test_a_batch_past_its_window_expires_with_what_is_done():
    batch = validated_batch([request_line("a"), request_line("b")])
    services.line_record(claimed(batch, 1)["a"], services.Outcome(200, orjson.dumps({})))
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    batch.refresh_from_db()
    assert services.batch_end(batch) == BatchStatus.EXPIRED
    batch.refresh_from_db()
    assert batch.expired_at is not None
    assert [e["error"]["code"] for e in output_of(batch.error_file)] == ["batch_expired"]


def test_batches_are_listed_newest_first_a_page_at_a_time():
    key, _ = make_api_key()
    made = [make_batch([request_line("a")], key).id for _ in range(3)]
    first, more = batches_page(key.tenant_id, limit=2, after=None)
    assert [b.id for b in first] == made[:0:-1] and more
    rest, more = batches_page(key.tenant_id, limit=2, after=first[-1].id)
    assert [b.id for b in rest] == made[:1] and not more


def test_expired_files_are_purged_with_their_bytes():
    batch = make_batch([request_line("a")])
    file = batch.input_file
    storage, name = file.content.storage, file.content.name
    assert storage.exists(name)
    type(file).objects.filter(id=file.id).update(expires_at=timezone.now())
    assert services.files_purge() == 1
    assert not storage.exists(name)


def test_an_answer_whose_text_postgresql_json_cannot_hold_is_kept_and_given_back_as_sent():
    """A model's text may hold a NUL (\\u0000), which PostgreSQL's JSON refuses: the answer is
    kept as the API sent it, not re-encoded, and the line is answered once."""
    batch = validated_batch([request_line("a")])
    sent = b'{"choices":[{"message":{"content":"odd \\u0000 text"}}],"usage":{"prompt_tokens":1}}'
    services.line_record(claimed(batch, 1)["a"], services.Outcome(200, sent))
    batch.refresh_from_db()
    assert services.batch_end(batch) == BatchStatus.COMPLETED
    batch.refresh_from_db()
    with batch.output_file.content.open("rb") as handle:
        line = handle.read()
    assert sent in line
    assert json.loads(line)["response"]["body"]["choices"][0]["message"]["content"] == "odd \0 text"
    assert batch.input_tokens == 1


def test_lines_that_share_their_prompts_start_are_run_one_after_another():
    """So that the router's prefix affinity sends them to the node that caches that start."""
    shared = "You are a careful reviewer. " * 40  # longer than the key's PREFIX_CHARS
    lines = []
    for i in range(6):
        text = (shared if i % 2 else f"Question {i}: ") + f"item {i}"
        lines.append(request_line(f"l{i}", text=text))
    batch = validated_batch(lines)
    order = [line.custom_id for line in services.lines_claim(batch, 6)]
    together = [order.index(c) for c in ("l1", "l3", "l5")]
    assert max(together) - min(together) == 2, order
