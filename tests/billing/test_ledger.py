"""The usage buffer and its flush, against real Redis and PostgreSQL."""

import io

import orjson
import pytest
from django.db import OperationalError
from django.utils import timezone

from apps.billing import ledger
from apps.billing.models import UsageDaily, UsageRecord
from apps.billing.selectors import statement_of
from apps.billing.services import usage as usage_services
from apps.billing.services import usage_flush
from dmxplatform import streams
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import append_usage as append
from tests.keys.factories import make_api_key
from tests.keys.factories import make_usage_event as event
from tests.stack import wait_for

# The default request store: one shard.
USAGE = ledger.USAGE_STREAM.shard(0)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def test_flush_moves_events_into_records_and_empties_the_stream():
    key, _ = make_api_key()
    events = [event(key, completion_tokens=n) for n in range(5)]
    append(*events)
    assert usage_flush() == 5
    rows = UsageRecord.objects.filter(api_key=key).order_by("completion_tokens")
    assert [r.completion_tokens for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0].request_id == events[0].request_id and rows[0].timings == {"auth": 0.01}
    assert sync_redis().xlen(USAGE.key()) == 0
    assert usage_flush() == 0


def test_the_intent_confidence_is_recorded_and_older_entries_without_it_still_drain():
    key, _ = make_api_key()
    unsure = event(key, intent="code", intent_confidence=0.41, intent_low_confidence=True)
    # An entry a gateway appended before the fields existed: the same JSON without them.
    older = event(key, intent="chat")
    fields = orjson.loads(older.encode())
    del fields["intent_confidence"], fields["intent_low_confidence"]
    append(unsure)
    sync_redis().xadd(USAGE.key(), {streams.FIELD: orjson.dumps(fields)})
    assert usage_flush() == 2
    recorded = UsageRecord.objects.get(request_id=unsure.request_id)
    assert (recorded.intent_confidence, recorded.intent_low_confidence) == (0.41, True)
    recorded = UsageRecord.objects.get(request_id=older.request_id)
    assert (recorded.intent, recorded.intent_confidence, recorded.intent_low_confidence) == (
        "chat",
        None,
        False,
    )


def test_the_same_request_is_recorded_once():
    key, _ = make_api_key()
    duplicate = event(key)
    append(duplicate, duplicate)
    usage_flush()
    append(duplicate)  # redelivered after a crash
    usage_flush()
    assert UsageRecord.objects.filter(request_id=duplicate.request_id).count() == 1


def test_events_wait_in_redis_while_the_database_fails(monkeypatch):
    key, _ = make_api_key()
    waiting = event(key)
    append(waiting)

    def database_down(entries):
        raise OperationalError("connection refused")

    monkeypatch.setattr(usage_services, "_usage_insert", database_down)
    assert usage_flush() == 0
    # Read but unacknowledged: pending for this consumer, still in the stream.
    assert sync_redis().xpending(USAGE.key(), streams.GROUP)["pending"] == 1
    monkeypatch.undo()
    assert usage_flush() == 1
    assert UsageRecord.objects.filter(request_id=waiting.request_id).exists()
    assert sync_redis().xlen(USAGE.key()) == 0


def test_an_event_that_can_never_be_stored_goes_to_the_dead_letter_stream():
    key, _ = make_api_key()
    good, orphan = event(key), event(key, api_key_id=10**12)  # no such key
    append(good, orphan)
    usage_flush()
    assert UsageRecord.objects.filter(request_id=good.request_id).exists()
    dead = sync_redis().xrange(USAGE.dead_letter_key())
    assert len(dead) == 1
    assert ledger.UsageEvent.decode(dead[0][1][streams.FIELD]).request_id == orphan.request_id
    assert sync_redis().xlen(USAGE.key()) == 0


def _drainer_connection():
    """A connection of another process's drain, to PostgreSQL's test database."""
    import psycopg
    from django.db import connection

    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    )


def test_a_second_flush_while_one_runs_returns_at_once():
    with _drainer_connection() as other:
        lock = USAGE.lock_id()
        assert other.execute("SELECT pg_try_advisory_lock(%s)", [lock]).fetchone()[0]
        key, _ = make_api_key()
        append(event(key))
        assert usage_flush() == 0
        other.execute("SELECT pg_advisory_unlock(%s)", [lock])
    assert usage_flush() == 1


def test_a_drainer_that_died_holding_the_lock_holds_nothing_back():
    """The lock goes with its holder (here: its connection, closed without unlocking), not
    after an expiry: a Redis key with one, reloaded by a Redis killed mid-drain, once stopped
    every flush for two minutes."""
    other = _drainer_connection()
    assert other.execute("SELECT pg_try_advisory_lock(%s)", [USAGE.lock_id()]).fetchone()[0]
    key, _ = make_api_key()
    entry = event(key)
    append(entry)
    assert usage_flush() == 0
    other.close()
    # The server ends the closed session, and its lock, a moment after the client closed it;
    # under load that moment is long enough for a flush to still find the lock taken. Then the
    # next flush (this test's, or the running platform's Celery) stores the record.
    stored = UsageRecord.objects.filter(request_id=entry.request_id)
    wait_for(lambda: usage_flush() or stored.exists(), timeout=10, what="the record stored")
    assert stored.count() == 1


def test_logged_unrecorded_events_are_replayed_once(tmp_path):
    """A gateway that lost Redis mid-request logged the events; replaying the log stores each
    request once, also one that did arrive after all, and reports the lines it cannot read."""
    from django.core.management import call_command

    key, _ = make_api_key()
    arrived, lost = event(key), event(key, completion_tokens=3)
    append(arrived)
    assert usage_flush() == 1
    log = tmp_path / "gateway.log"
    log.write_text(
        "INFO uvicorn started\n"
        + "".join(
            f"2026-11-29 20:00:00 ERROR apps.gateway.pipeline {ledger.UNRECORDED} "
            f"{e.encode().decode()}\n"
            for e in (arrived, lost)
        )
        + f"ERROR apps.gateway.pipeline {ledger.UNRECORDED} {{cut off\n"
    )
    out, err = io.StringIO(), io.StringIO()
    call_command("usage_replay", str(log), stdout=out, stderr=err)
    assert "appended 2 usage events; 1 lines unreadable" in out.getvalue()
    assert "skipped" in err.getvalue()
    usage_flush()
    rows = UsageRecord.objects.filter(api_key=key).order_by("completion_tokens")
    assert [(r.request_id, r.completion_tokens) for r in rows] == [
        (lost.request_id, 3),
        (arrived.request_id, 7),
    ]


def test_a_batchs_requests_are_rolled_up_and_stated_apart_and_a_request_id_is_stored_once():
    key, _ = make_api_key()
    interactive = event(key, cost_micros=1_000)
    first = event(key, batch_id="batch_1", cost_micros=500)
    # The same try of a batch line settled twice (its worker lost between its settle and its
    # answer being kept): the ledger keeps one.
    again = event(key, request_id=first.request_id, batch_id="batch_1", cost_micros=500)
    append(interactive, first, again)
    assert usage_flush() == 3
    assert UsageRecord.objects.filter(batch_id="batch_1").count() == 1
    days = UsageDaily.objects.filter(api_key=key).order_by("batch")
    assert [(d.batch, d.requests) for d in days] == [(False, 1), (True, 1)]
    lines = statement_of(tenant_id=key.tenant_id, month=timezone.now().date()).lines
    assert [(line.model, line.batch, str(line.cost)) for line in lines] == [
        ("m", False, "0.001000"),
        ("m", True, "0.000500"),
    ]


def test_daily_totals_add_up_across_flushes_keys_models_and_statuses(monkeypatch):
    """One upsert per chunk of totals (_usage_rollup): a new total is inserted, an existing one
    added to, across chunks of a flush and across flushes."""
    monkeypatch.setattr(usage_services, "ROLLUP_ROWS", 2)  # several statements per flush
    keys = [make_api_key()[0] for _ in range(3)]
    rounds = [
        [event(k, model=m, prompt_tokens=10, cached_tokens=4, completion_tokens=n, cost_micros=1500)
         for k in keys for m in ("a", "b") for n in (1, 2)]
        + [event(keys[0], model="a", status="error", http_status=502, prompt_tokens=3,
                 completion_tokens=0, cost_micros=0)],
        [event(k, model="a", prompt_tokens=5, completion_tokens=5, cost_micros=250) for k in keys],
    ]  # fmt: skip
    for events in rounds:
        append(*events)
        assert usage_flush() == len(events)
    days = {
        (d.api_key_id, d.model): d
        for d in UsageDaily.objects.filter(api_key__in=keys, day=timezone.now().date())
    }
    assert len(days) == 6
    for key in keys:
        first, other = days[(key.id, "a")], days[(key.id, "b")]
        errored = key == keys[0]
        assert (first.requests, first.errors) == (3 + errored, int(errored))
        assert first.prompt_tokens == 10 + 10 + 5 + 3 * errored
        assert (first.cached_tokens, first.completion_tokens) == (8, 1 + 2 + 5)
        assert str(first.cost) == "0.003250"
        assert (other.requests, other.errors, other.completion_tokens) == (2, 0, 3)
        assert (other.tenant_id, str(other.cost)) == (key.tenant_id, "0.003000")
