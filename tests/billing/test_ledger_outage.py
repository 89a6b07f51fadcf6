"""The usage ledger through a PostgreSQL outage: serving goes on, records wait, then arrive once.

The platform's processes reach PostgreSQL through a proxy (tests/faults.py); cutting it resets
their connections and refuses new ones, as a dead database server would.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection

from apps.billing import ledger
from apps.billing.models import UsageDaily, UsageRecord
from dmxplatform.redis_client import sync_redis
from tests.conftest import fleet_node
from tests.http import call
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.stack import wait_for

# The default request store: one shard.
USAGE = ledger.USAGE_STREAM.shard(0)

BODY = {
    "model": "dmx-tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "ignore_eos": True,
}


def test_requests_are_served_and_recorded_exactly_once_across_an_outage(platform, committed):
    key, secret = make_api_key()
    for api_url in platform.api_urls:  # keys are cached before the database goes
        assert call("POST", api_url + "/chat/completions", key=secret, json_body=BODY).status == 200

    platform.database.cut()
    cut_at = time.time()
    try:
        ids = []
        for i in range(12):
            reply = call(
                "POST", platform.api_urls[i % 2] + "/chat/completions", key=secret, json_body=BODY
            )
            assert reply.status == 200, reply.body
            ids.append(reply.headers["x-request-id"])
        # Past a node's staleness window: heartbeats must keep nodes live without SQL.
        wait_for(
            lambda: (
                (node := fleet_node(platform.workers["dmx-tiny"].node_name)) is not None
                and node.heartbeat_at > cut_at + settings.DMX_NODE_STALE_SECONDS
            ),
            timeout=30,
            what="a heartbeat past the staleness window",
        )
        reply = call("POST", platform.api_url + "/chat/completions", key=secret, json_body=BODY)
        assert reply.status == 200, reply.body
        ids.append(reply.headers["x-request-id"])
        assert UsageRecord.objects.filter(request_id__in=ids).count() == 0
        waiting = sync_redis().xlen(USAGE.key())
        assert waiting >= len(ids)
    finally:
        platform.database.restore()

    wait_for(
        lambda: UsageRecord.objects.filter(request_id__in=ids).count() == len(ids),
        timeout=30,
        what="the buffered usage records to arrive",
    )
    time.sleep(2)  # a few more flushes: nothing may arrive twice
    connection.close()
    records = UsageRecord.objects.filter(api_key=key)
    assert records.count() == len(ids) + 2
    assert all(r.completion_tokens == 3 for r in records)
    # The gateways read the database again: a model added now reaches their catalogs (no node
    # serves it, so 503 instead of 404 once they know it).
    make_model("dmx-after-outage")
    for api_url in platform.api_urls:
        body = dict(BODY, model="dmx-after-outage")
        wait_for(
            lambda url=api_url, body=body: (
                call("POST", url + "/chat/completions", key=secret, json_body=body).status == 503
            ),
            timeout=5,
            what=f"{api_url} to reload its catalog after the outage",
        )
    daily = UsageDaily.objects.get(api_key=key, model="dmx-tiny")
    assert daily.requests == len(ids) + 2
    assert daily.completion_tokens == 3 * (len(ids) + 2)
    assert daily.prompt_tokens == sum(r.prompt_tokens for r in records)


def test_an_event_postgresql_refuses_is_parked_and_the_rest_arrive(platform, committed):
    """Such an event once stopped the ledger for every tenant. The gateway no longer makes one
    (it escapes and cuts what a client sends), so it is put on the stream here by hand."""
    from apps.billing.ledger import UsageEvent
    from dmxplatform import streams
    from tests.faults import assert_recorded_once, send_chat
    from tests.keys.factories import append_usage, make_usage_event

    key, secret = make_api_key()
    sent = [send_chat(platform.api_url, secret, BODY) for _ in range(3)]
    poison = make_usage_event(key, model="dmx\x00tiny")
    append_usage(poison)
    sent += [send_chat(platform.api_url, secret, BODY) for _ in range(3)]
    assert [s.status for s in sent] == [200] * 6
    assert_recorded_once(sent, key=key)

    parked = [
        entry
        for entry in streams.parked(USAGE)
        if UsageEvent.decode(entry.payload).request_id == poison.request_id
    ]
    assert len(parked) == 1 and parked[0].reason
    metrics = call("GET", platform.url + "/metrics").body.decode()
    assert 'dmx_stream_parked_entries{shard="0",stream="usage.stream"}' in metrics
    streams.parked_discard(USAGE, [parked[0].id])  # the suite's other checks start clean
