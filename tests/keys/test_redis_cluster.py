"""The request store on a real Redis Cluster: three masters started here (tests/faults.py).

Limits, leases, exact billing, breakers and the ledger's sharded streams hold on it as on one
Redis; one request's keys share a slot; and a dead master fails its tenants' requests closed
(503 limits_unavailable) while the other masters' tenants are served.
"""

from __future__ import annotations

import contextlib
import logging
import time

import psycopg
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from redis.crc import key_slot

from apps.billing import ledger, tasks
from apps.billing.models import UsageRecord
from apps.billing.services import usage_flush
from apps.keys.keycache import BudgetLimit, Limits, Quota
from apps.keys.leases import LeaseBook
from apps.keys.limiter import Limiter
from apps.keys.ratelimit import Meter, rules_for
from apps.routing.breaker import BreakerBoard, BreakerState
from apps.routing.decisions import DECISION_STREAM
from apps.routing.services import breaker_reset
from dmxplatform import streams
from dmxplatform.metrics import StreamCollector
from dmxplatform.redis_client import request_redis, shard_of, tenant_rkey
from tests.faults import OwnRedisCluster
from tests.gateway.test_runtime_checks import run_persistence_check
from tests.http import call
from tests.keys.factories import (
    append_usage,
    make_api_key,
    make_key_record,
    make_tenant,
    run_with_redis,
)
from tests.keys.factories import make_usage_event as usage_event
from tests.stack import wait_for

SHARDS = 6
MODEL = "dmx-tiny"


@pytest.fixture
def on_cluster(redis_cluster, settings) -> OwnRedisCluster:
    """This process's request store is the cluster, its tenants spread over SHARDS slots."""
    settings.DMX_REQUEST_REDIS_URL = redis_cluster.url
    settings.DMX_REQUEST_REDIS_CLUSTER = True
    settings.DMX_REQUEST_REDIS_SHARDS = SHARDS
    return redis_cluster


def tenant_per_master(cluster: OwnRedisCluster) -> dict[int, int]:
    """A tenant id whose keys live on each master, by master."""
    found: dict[int, int] = {}
    for tenant_id in range(1, 200):
        found.setdefault(cluster.node_of(tenant_rkey(tenant_id, "probe")), tenant_id)
        if len(found) == len(cluster.ports):
            return found
    raise AssertionError(f"{SHARDS} shards do not cover every master: {found}")


def test_every_key_of_one_request_shares_its_tenants_slot(settings):
    settings.DMX_REQUEST_REDIS_SHARDS = 64
    slots_of_tenants = set()
    for tenant_id in range(1, 200):
        record = make_key_record(
            tenant_id=tenant_id,
            tenant_limits=Limits(requests_per_minute=10, tokens_per_minute=1000),
            key_limits=Limits(requests_per_minute=5, max_concurrent_requests=2),
            quotas=(
                Quota(scope="tenant", period="month", model="", tokens=10**6),
                Quota(scope="key", period="day", model=MODEL, tokens=10**5),
            ),
            budgets=(
                BudgetLimit(id=1, scope="tenant", period="month", micros=10**8),
                BudgetLimit(id=2, scope="key", period="week", micros=10**7, hard=False),
            ),
            prepaid=True,
        )
        rules = rules_for(record, model=MODEL, nonce="n-1")
        assert {rule.meter for rule in rules} == set(Meter.ALL)
        keys = [rule.key for rule in rules] + [
            ledger.USAGE_STREAM.of_tenant(tenant_id).key(),
            DECISION_STREAM.of_tenant(tenant_id).key(),
        ]
        slots = {key_slot(key.encode()) for key in keys}
        assert len(slots) == 1, (tenant_id, keys)
        slots_of_tenants |= slots
    # Tenants spread over as many slots as there are shards, no more (the streams are per shard).
    assert len(slots_of_tenants) == 64


def test_limits_hold_on_every_master(on_cluster):
    tenants = tenant_per_master(on_cluster)
    assert len(set(tenants.values())) == 3

    async def scenario(redis):
        limiter = Limiter(redis)
        outcomes = {}
        for master, tenant_id in tenants.items():
            record = make_key_record(
                id=1000 + tenant_id,
                tenant_id=tenant_id,
                key_limits=Limits(requests_per_minute=3, max_concurrent_requests=2),
            )
            rules = rules_for(record, model=MODEL)
            seen = []
            for i in range(3):
                seen.append(await limiter.admit(f"r-{tenant_id}-{i}", rules, tokens=10))
            await limiter.settle(seen[0], refund=5, events=[])
            seen.append(await limiter.admit(f"r-{tenant_id}-3", rules, tokens=10))
            await limiter.settle(seen[1], refund=5, events=[])
            seen.append(await limiter.admit(f"r-{tenant_id}-4", rules, tokens=10))
            outcomes[master] = [(a.admitted, a.failed.meter if a.failed else None) for a in seen]
        return outcomes

    outcomes = run_with_redis(scenario)
    # On every master alike: two in flight, a third refused by the concurrency limit (and not
    # counted); once one settles, a third fits; once another does, the rpm bucket is empty.
    expected = [(True, None), (True, None), (False, Meter.CONCURRENCY), (True, None)]
    assert outcomes == {master: [*expected, (False, Meter.REQUESTS)] for master in tenants}


def test_leases_and_settlement_give_back_exactly_on_the_cluster(on_cluster):
    (tenant_id, *_) = tenant_per_master(on_cluster).values()
    record = make_key_record(
        tenant_id=tenant_id,
        key_limits=Limits(requests_per_minute=1000),
        quotas=(Quota(scope="key", period="day", model="", tokens=100_000),),
    )
    rules = rules_for(record, model=MODEL)
    (quota,) = [rule for rule in rules if rule.meter == Meter.QUOTA]
    stream = ledger.USAGE_STREAM.of_tenant(tenant_id).key()

    async def scenario(redis):
        limiter = Limiter(redis, LeaseBook(requests=16, ttl=60.0))
        admissions = [await limiter.admit(f"lease-{i}", rules, tokens=100) for i in range(10)]
        leased = int(request_redis().get(quota.key))
        for i, admission in enumerate(admissions):
            # Each used 30 of the 100 tokens it reserved; its usage record rides along.
            await limiter.settle(admission, refund=70, events=[(stream, f"e{i}".encode())])
        given_back = await limiter.end_leases(everything=True)
        return [a.admitted for a in admissions], leased, given_back

    admitted, leased, given_back = run_with_redis(scenario)
    assert admitted == [True] * 10
    # The first admission went to Redis and brought a lease for more; the rest came from it.
    assert leased > 10 * 100
    assert given_back == 1
    assert int(request_redis().get(quota.key)) == 10 * 30  # what was used, to the token
    assert request_redis().xlen(stream) == 10
    request_redis().delete(stream)  # not usage records: no other test of the module drains them


def test_usage_in_every_shard_drains_to_postgresql_exactly(on_cluster, committed):
    keys = [make_api_key(tenant=make_tenant())[0] for _ in range(SHARDS)]
    assert {shard_of(key.tenant_id) for key in keys} == set(range(SHARDS))
    events = [
        usage_event(key, request_id=f"cluster-{key.id}-{i}", prompt_tokens=7 + i)
        for key in keys
        for i in range(4)
    ]
    append_usage(*events)
    shards = [ledger.USAGE_STREAM.shard(number) for number in range(SHARDS)]
    assert [request_redis().xlen(shard.key()) for shard in shards] == [4] * SHARDS
    # Each shard has its own drain lock: one held elsewhere holds back that shard alone.
    with _advisory_lock(shards[0].lock_id()):
        assert usage_flush(shard=0) == 0
        assert usage_flush(shard=1) == 4
    assert usage_flush() == 4 * (SHARDS - 1)
    stored = UsageRecord.objects.filter(api_key__in=keys)
    assert sorted(stored.values_list("request_id", "prompt_tokens")) == sorted(
        (event.request_id, event.prompt_tokens) for event in events
    )
    assert [request_redis().xlen(shard.key()) for shard in shards] == [0] * SHARDS


def test_the_beats_flush_task_drains_each_shard_in_a_task_of_its_own(
    on_cluster, committed, eager_celery, monkeypatch
):
    drained = []

    def usage_flush_spy(*, shard=None):
        drained.append(shard)
        return usage_flush(shard=shard)

    monkeypatch.setattr(tasks, "usage_flush", usage_flush_spy)
    keys = [make_api_key(tenant=make_tenant())[0] for _ in range(SHARDS)]
    events = [usage_event(key, request_id=f"fan-out-{key.id}") for key in keys]
    append_usage(*events)
    tasks.usage_flush_task.delay()
    assert sorted(drained) == list(range(SHARDS))
    assert (
        UsageRecord.objects.filter(request_id__in=[e.request_id for e in events]).count() == SHARDS
    )
    shards = [ledger.USAGE_STREAM.shard(number) for number in range(SHARDS)]
    assert [request_redis().xlen(shard.key()) for shard in shards] == [0] * SHARDS


@contextlib.contextmanager
def _advisory_lock(lock_id: int):
    """Hold a drain's lock from another database session, as another Celery worker would."""
    params = connection.get_connection_params()
    with psycopg.connect(
        dbname=params["dbname"], user=params.get("user"), host=params.get("host"), autocommit=True
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        try:
            yield
        finally:
            # Now, not when the server gets round to ending the closed session.
            other.execute("SELECT pg_advisory_unlock(%s)", [lock_id])


def test_breakers_are_shared_through_the_cluster(on_cluster, settings, committed):
    settings.DMX_BREAKER_FAILURES = 2

    async def scenario(redis):
        a, b = BreakerBoard(redis), BreakerBoard(redis)
        for _ in range(2):
            await a.record(41, failed=True)
        await b.refresh()
        seen_open = b.state(41)
        probes = [await b.try_probe(41), await a.try_probe(41)]
        return seen_open, probes

    seen_open, probes = run_with_redis(scenario)
    assert seen_open == BreakerState.OPEN
    assert probes == [True, False]  # one probe for every replica together
    breaker_reset(node_id=41)

    async def after_reset(redis):
        board = BreakerBoard(redis)
        await board.refresh()
        return board.state(41)

    assert run_with_redis(after_reset) == BreakerState.CLOSED


def test_the_gateway_refuses_a_cluster_with_a_master_that_keeps_no_append_only_file(
    on_cluster, settings, caplog
):
    settings.DMX_REDIS_REQUIRE_AOF = True
    run_persistence_check()  # every master is append-only
    volatile = redis.Redis(port=on_cluster.ports[1])
    volatile.config_set("appendonly", "no")
    try:
        with pytest.raises(ImproperlyConfigured, match="appendonly"):
            run_persistence_check()
    finally:
        volatile.config_set("appendonly", "yes")
    on_cluster.kill(2)
    try:
        with caplog.at_level(logging.WARNING, logger="apps.gateway.runtime"):
            run_persistence_check()  # a master away is left unchecked: no reason not to start
        assert "1 of 3 request-store masters unchecked for AOF" in caplog.text
    finally:
        on_cluster.restart(2)


def test_a_master_away_costs_the_stream_figures_of_its_own_shards_only(on_cluster):
    """/metrics reads each shard's streams on its own: with one master killed, every shard on
    the other two still has its backlog gauge, and the dead master's have none (not zeros)."""
    by_master: dict[int, set[str]] = {}
    for shard in streams.every_shard():
        by_master.setdefault(on_cluster.node_of(shard.key()), set()).add(
            f"{shard.stream.label}/{shard.number}"
        )
    assert len(by_master) == len(on_cluster.ports), by_master  # the premise: every master has some
    dying = 0
    on_cluster.kill(dying)
    try:
        (backlog, _, _) = StreamCollector().collect()
        reported = {f"{s.labels['stream']}/{s.labels['shard']}" for s in backlog.samples}
    finally:
        on_cluster.restart(dying)
    alive = set().union(*(shards for master, shards in by_master.items() if master != dying))
    assert reported == alive


def test_a_dead_master_fails_its_tenants_closed_and_others_are_served(
    platform, committed, on_cluster
):
    """A gateway on the cluster: a master's death refuses its tenants' requests (503), serves
    the others', admits nothing past a limit once the master is back, and bills every request
    it served."""
    tenants = {}
    while len(tenants) < 2:  # two tenants on two different masters
        tenant = make_tenant()
        tenants.setdefault(on_cluster.node_of(tenant_rkey(tenant.id, "probe")), tenant)
    (dying, dying_tenant), (_, living_tenant) = tenants.items()
    doomed_key, doomed = make_api_key(tenant=dying_tenant, requests_per_minute=3)
    served_key, served = make_api_key(tenant=living_tenant)
    gateway, url = platform.stack.spare_gateway(
        "gateway-cluster",
        settings={
            "DMX_REQUEST_REDIS_URL": on_cluster.url,
            "DMX_REQUEST_REDIS_CLUSTER": "1",
            "DMX_REQUEST_REDIS_SHARDS": str(SHARDS),
        },
    )
    api = url + "/v1"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ok = []
    try:
        ok += [chat(api, doomed, body) for _ in range(2)]
        assert [reply.status for reply in ok] == [200, 200]
        time.sleep(1.2)  # appendfsync everysec: the counters are on disk
        on_cluster.kill(dying)
        refused = chat(api, doomed, body)
        assert refused.status == 503, refused.body
        assert refused.json()["error"]["code"] == "limits_unavailable"
        ok.append(chat(api, served, body))
        assert ok[-1].status == 200
        on_cluster.restart(dying)
        replies = [chat(api, doomed, body) for _ in range(2)]
        # The rpm bucket came back with the master: one request left of three, then 429.
        assert [reply.status for reply in replies] == [200, 429]
        ok.append(replies[0])
    finally:
        gateway.stop()
    # Every request served is billed, from the cluster's streams, to the token.
    wait_for(lambda: usage_flush() == 0 and _billed(doomed_key, served_key) == len(ok), timeout=20)
    billed = UsageRecord.objects.filter(api_key__in=(doomed_key, served_key), http_status=200)
    assert sorted(billed.values_list("request_id", "prompt_tokens", "completion_tokens")) == sorted(
        (
            reply.headers["x-request-id"],
            reply.json()["usage"]["prompt_tokens"],
            reply.json()["usage"]["completion_tokens"],
        )
        for reply in ok
    )


def _billed(*keys) -> int:
    return UsageRecord.objects.filter(api_key__in=keys, http_status=200).count()


def chat(api: str, key: str, body: dict):
    return call("POST", api + "/chat/completions", key=key, json_body=body)
