"""Durable streams against real Redis and PostgreSQL: an entry the database refuses is parked with
its reason and never holds back the entries behind it; an outage leaves everything pending."""

from __future__ import annotations

import pytest
from django.db import OperationalError, ProgrammingError
from django.urls import reverse
from prometheus_client import generate_latest

from apps.billing import ledger, tasks
from apps.billing.models import UsageRecord
from apps.billing.services import usage as usage_services
from apps.billing.services import usage_flush
from apps.keys.models import ApiKey
from config import exposition
from dmxplatform import streams
from dmxplatform.redis_client import sync_redis
from tests.gateway.test_runtime_checks import run_start_step
from tests.keys.factories import append_usage as append
from tests.keys.factories import make_api_key
from tests.keys.factories import make_usage_event as event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]
# The suite runs with one request-store shard: every usage event goes to this stream.
USAGE = ledger.USAGE_STREAM.shard(0)


def parked_reasons() -> dict[str, str]:
    return {
        ledger.UsageEvent.decode(entry.payload).request_id: entry.reason
        for entry in streams.parked(USAGE)
    }


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param({"model": "dmx\x00tiny"}, id="nul-in-text"),
        pytest.param({"model": "m" * 129}, id="longer-than-its-column"),
        pytest.param({"content_flags": ["a\x00b"]}, id="nul-in-json"),
        pytest.param({"api_key_id": 10**12}, id="refers-to-nothing"),
    ],
)
def test_an_entry_the_database_refuses_is_parked_and_the_rest_arrive(poison):
    """One such event used to stop the ledger for everyone: the drain took PostgreSQL's refusal
    for an outage and retried the same batch forever."""
    key, _ = make_api_key()
    before = [event(key) for _ in range(3)]
    bad = event(key, **poison)
    after = [event(key) for _ in range(3)]
    append(*before, bad, *after)

    assert usage_flush() == 6
    stored = set(UsageRecord.objects.filter(api_key=key).values_list("request_id", flat=True))
    assert stored == {e.request_id for e in before + after}
    reasons = parked_reasons()
    assert list(reasons) == [bad.request_id]
    assert reasons[bad.request_id]  # the database's own words, for the operator
    assert sync_redis().xlen(USAGE.key()) == 0
    # The ledger goes on: the next request is stored as usual.
    later = event(key)
    append(later)
    assert usage_flush() == 1
    assert UsageRecord.objects.filter(request_id=later.request_id).exists()


def test_batches_behind_a_bad_entry_are_drained_in_the_same_flush():
    key, _ = make_api_key()
    events = [event(key) for _ in range(7)]
    events[1] = event(key, model="\x00")
    append(*events)
    assert streams.drain(USAGE, _store_usage, batch_size=3) == 6
    assert sync_redis().xlen(USAGE.key()) == 0


def _store_usage(pairs):
    from apps.billing.services.usage import _usage_store

    return _usage_store(pairs)


def test_an_unreadable_entry_is_parked_with_why():
    key, _ = make_api_key()
    good = event(key)
    sync_redis().xadd(USAGE.key(), {streams.FIELD: b"{not json"})
    append(good)
    assert usage_flush() == 1
    (parked,) = streams.parked(USAGE)
    assert parked.payload == b"{not json"
    assert parked.reason.startswith("unreadable usage event")


@pytest.mark.parametrize(
    "failure",
    [
        OperationalError("cannot execute INSERT in a read-only transaction"),
        OperationalError("could not extend file: No space left on device"),
        ProgrammingError('relation "keys_usagerecord" does not exist'),
    ],
    ids=["read-only-after-failover", "disk-full", "migration-missing"],
)
def test_a_database_that_answers_but_refuses_every_write_parks_nothing(monkeypatch, failure):
    """Only what an entry can be at fault for parks it: a database failing every write alike
    would otherwise empty the whole ledger into the dead-letter stream."""
    key, _ = make_api_key()
    append(event(key), event(key, model="\x00"), event(key))

    def refuse(entries):
        raise failure

    monkeypatch.setattr(usage_services, "_usage_insert", refuse)
    assert usage_flush() == 0
    assert streams.parked(USAGE) == []
    assert sync_redis().xlen(USAGE.key()) == 3
    monkeypatch.undo()
    assert usage_flush() == 2  # the database is back: the bad one alone is parked
    assert len(streams.parked(USAGE)) == 1


def test_requeued_entries_are_stored_once_their_cause_is_fixed():
    key, _ = make_api_key()
    orphan = event(key)
    fields = {f.attname: getattr(key, f.attname) for f in ApiKey._meta.concrete_fields}
    key.delete()  # an operator deleted the key while its last request was in the buffer
    append(orphan)
    usage_flush()
    (parked,) = streams.parked(USAGE)
    assert "IntegrityError" in parked.reason
    ApiKey.objects.create(**fields)  # ... and restored it
    assert streams.parked_requeue(USAGE, [parked.id]) == 1
    assert usage_flush() == 1
    assert UsageRecord.objects.filter(request_id=orphan.request_id).count() == 1
    assert streams.parked(USAGE) == []


def test_backlog_age_and_parked_entries_are_gauges_at_metrics():
    assert exposition  # registers the scrape-time collectors with prometheus_client on import
    key, _ = make_api_key()
    append(event(key, model="\x00"))
    usage_flush()
    append(event(key), event(key))
    text = generate_latest().decode()
    assert 'dmx_stream_backlog_entries{shard="0",stream="usage.stream"} 2.0' in text
    assert 'dmx_stream_parked_entries{shard="0",stream="usage.stream"} 1.0' in text
    assert 'dmx_stream_oldest_entry_age_seconds{shard="0",stream="usage.stream"}' in text
    assert 'dmx_stream_backlog_entries{shard="0",stream="routing.decisions"} 0.0' in text


def test_the_admin_lists_parked_entries_and_puts_them_back(admin_client):
    key, _ = make_api_key()
    bad = event(key, model="m" * 200)
    append(bad)
    usage_flush()
    page = admin_client.get(reverse("admin:platform_parked"))
    assert page.status_code == 200
    html = page.content.decode()
    assert bad.request_id in html
    assert "DataError" in html  # the reason PostgreSQL gave
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:platform_parked") in index

    (parked,) = streams.parked(USAGE)
    reply = admin_client.post(
        reverse("admin:platform_parked"),
        {"stream": USAGE.label, "entry": parked.id.decode(), "action": "requeue"},
    )
    assert reply.status_code == 302
    assert streams.parked(USAGE) == []
    assert sync_redis().xlen(USAGE.key()) == 1
    usage_flush()  # still too long: parked again, with its reason
    assert list(parked_reasons()) == [bad.request_id]
    (again,) = streams.parked(USAGE)
    admin_client.post(
        reverse("admin:platform_parked"),
        {"stream": USAGE.label, "entry": again.id.decode(), "action": "discard"},
    )
    assert streams.parked(USAGE) == []


def test_only_superusers_act_on_parked_entries(client, django_user_model):
    staff = django_user_model.objects.create_user("ops", password="pw-12345678", is_staff=True)
    client.force_login(staff)
    assert client.get(reverse("admin:platform_parked")).status_code == 200
    reply = client.post(
        reverse("admin:platform_parked"),
        {"stream": USAGE.label, "entry": "0-1", "action": "discard"},
    )
    assert reply.status_code == 403


def test_the_admin_puts_back_all_parked_entries_at_once(admin_client):
    key, _ = make_api_key()
    append(*(event(key, model="\x00") for _ in range(3)))
    usage_flush()
    assert streams.parked_count(USAGE) == 3
    page = admin_client.get(reverse("admin:platform_parked")).content.decode()
    assert "3 parked" in page
    url = reverse("admin:platform_parked")
    stream = USAGE.label
    # An id that is not one is ignored, not a 500 from Redis.
    reply = admin_client.post(url, {"stream": stream, "entry": "x' or 1", "action": "discard"})
    assert reply.status_code == 302 and streams.parked_count(USAGE) == 3
    admin_client.post(url, {"stream": stream, "action": "requeue_all"})
    assert streams.parked_count(USAGE) == 0
    assert sync_redis().xlen(USAGE.key()) == 3
    usage_flush()
    admin_client.post(url, {"stream": stream, "action": "discard_all"})
    assert streams.parked_count(USAGE) == 0


def start_gateway() -> None:
    """What a gateway does about shards as it starts: record how many streams it writes."""
    run_start_step("_record_shards")


def test_streams_of_shards_given_up_are_still_drained_and_counted(settings, eager_celery):
    """DMX_REQUEST_REDIS_SHARDS lowered from 4 to 2 while a gateway of the old setting still
    writes shard 3's stream (a rolling update): the beat's flush drains it, /metrics counts it."""
    assert exposition  # the scrape-time collectors are registered
    settings.DMX_REQUEST_REDIS_SHARDS = 4
    start_gateway()
    assert streams.shards_in_use() == 4
    key, _ = make_api_key()
    stranded = event(key)
    sync_redis().xadd(ledger.USAGE_STREAM.shard(3).key(), {streams.FIELD: stranded.encode()})
    settings.DMX_REQUEST_REDIS_SHARDS = 2
    start_gateway()  # a gateway of the new setting lowers nothing
    assert streams.shards_in_use() == 4
    text = generate_latest().decode()
    assert 'dmx_stream_backlog_entries{shard="3",stream="usage.stream"} 1.0' in text
    tasks.usage_flush_task.delay()
    assert UsageRecord.objects.filter(request_id=stranded.request_id).count() == 1
    assert sync_redis().xlen(ledger.USAGE_STREAM.shard(3).key()) == 0


def test_a_busy_stream_is_drained_again_at_once_not_at_the_next_beat(monkeypatch, eager_celery):
    """A task moves at most MAX_ROUNDS batches; one that moved that many goes again at once.
    The beat's every-2-s flush capped a stream at 5,000 entries a second, half of what one
    drain's CPU moves."""
    monkeypatch.setattr(streams, "MAX_ROUNDS", 1)
    key, _ = make_api_key()
    waiting = [event(key) for _ in range(2 * streams.BATCH + 3)]
    append(*waiting)
    tasks.usage_flush_task.delay()  # as the beat queues it: once
    assert UsageRecord.objects.filter(api_key=key).count() == len(waiting)
    assert sync_redis().xlen(USAGE.key()) == 0
