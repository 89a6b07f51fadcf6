"""Redis killed and restarted under load: every request is billed once, with no person in the loop.

A private stack (a gateway and Celery on a redis-server this test owns, append-only as
production must run it; a worker attached to one of the session's vLLM engines) serves a key
without limits, which needs no Redis to be admitted. Killing that Redis with -9 for five seconds
once lost the records of every request served meanwhile (84 here), kept only as log lines for
someone to replay by hand; the gateway now spools them to disk and puts them on the stream
when Redis is back, and the append-only file keeps what Redis had taken.
"""

from __future__ import annotations

import os
import threading
import time
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum

from apps.billing.choices import BillingMode
from apps.billing.models import BalanceMovement, UsageRecord
from apps.billing.services import account_of, account_update, top_up
from tests.conftest import _database_url
from tests.faults import OwnRedis, Sent, assert_recorded_once, send_chat
from tests.keys.factories import make_api_key, make_tenant
from tests.stack import Stack, wait_for

CLIENTS = 4
BODY = {
    "model": "dmx-tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "ignore_eos": True,
}


@pytest.fixture
def own_redis(tmp_path):
    redis = OwnRedis(tmp_path / "redis").start()
    yield redis
    redis.kill()


@pytest.fixture
def private_stack(platform, own_redis, tmp_path):
    env = dict(
        os.environ,
        REDIS_URL=own_redis.url,
        DATABASE_URL=_database_url(int(connection.settings_dict["PORT"])),
        DMX_SPOOL_DIR=str(tmp_path / "spool"),
        # Routing goes on from the last fleet state while Redis is away; an outage shorter
        # than this does not make the node stale.
        DMX_NODE_STALE_SECONDS="30",
    )
    stack = Stack(env=env, name="redis-fault")
    try:
        stack.start_gateway()
        stack.start_celery()
        engine = platform.workers["dmx-tiny"]
        stack.start_worker(
            model_name="dmx-tiny",
            node_token=platform.node_token,
            attach=f"http://127.0.0.1:{engine.port}",
        )
        yield stack
    finally:
        stack.stop()


def _traffic_through_an_outage(
    api_url: str, key: str, own_redis: OwnRedis
) -> tuple[list[Sent], list[Sent]]:
    """CLIENTS clients send requests for two seconds, while Redis is killed for five and after
    it came back for five: what they saw, all of it and what was sent and answered within the
    outage."""
    sent: list[Sent] = []
    during: list[Sent] = []
    outage: dict[str, float] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            started = time.monotonic()
            reply = send_chat(api_url, key, BODY, timeout=30)
            with lock:
                sent.append(reply)
                if outage.get("from", 1e18) <= started and time.monotonic() <= outage.get(
                    "to", 1e18
                ):
                    during.append(reply)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        # The scenario's phases are durations, not conditions to wait for.
        time.sleep(2)
        outage["from"] = time.monotonic()
        own_redis.kill()
        time.sleep(5)
        outage["to"] = time.monotonic()
        own_redis.start()  # reloads its append-only file
        time.sleep(5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    return sent, during


def _serving(api_url: str, platform) -> None:
    wait_for(
        lambda: send_chat(api_url, platform.api_key, BODY).status == 200,
        timeout=120,
        interval=0.5,
        what="the private gateway to serve",
    )


def test_usage_survives_a_redis_restart_under_load(
    platform, committed, private_stack, own_redis, tmp_path
):
    api_url = private_stack.gateways[0] + "/v1"
    _serving(api_url, platform)
    api_key, key = make_api_key()  # no limits: admitted without Redis
    sent, during = _traffic_through_an_outage(api_url, key, own_redis)
    assert any(s.status == 200 for s in during), "requests were served while Redis was down"
    assert sum(s.status == 200 for s in sent) >= 0.9 * len(sent), [s.status for s in sent]
    assert_recorded_once(sent, key=api_key, timeout=60)
    # Nothing is left for a person to do: the spool was replayed and emptied.
    spool = tmp_path / "spool"
    assert not [p for p in spool.glob("*") if p.stat().st_size], list(spool.glob("*"))


def test_a_prepaid_tenant_is_charged_once_per_request_across_a_redis_restart(
    platform, committed, private_stack, own_redis
):
    """A prepaid key needs Redis to be admitted (its balance is held there): refused while
    Redis is away, never waved through; every request answered is charged once in the book."""
    api_url = private_stack.gateways[0] + "/v1"
    _serving(api_url, platform)
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), mode=BillingMode.PREPAID)
    top_up(tenant_id=tenant.id, amount=Decimal("100"), actor="test")
    api_key, key = make_api_key(tenant=tenant)
    sent, during = _traffic_through_an_outage(api_url, key, own_redis)
    served = [s for s in sent if s.status == 200]
    assert served and {s.status for s in sent} <= {200, 503}, [s.status for s in sent]
    assert during and {s.status for s in during} == {503}, [s.status for s in during]
    assert_recorded_once(sent, key=api_key, timeout=60)
    records = UsageRecord.objects.filter(request_id__in=[s.request_id for s in served])
    costs = {record.request_id: record.cost for record in records}
    assert all(cost > 0 for cost in costs.values())

    def charged() -> list[BalanceMovement] | None:
        connection.close()
        found = list(BalanceMovement.objects.filter(account__tenant=tenant, kind="charge"))
        return found if len(found) >= len(costs) else None

    charges = wait_for(charged, timeout=60, interval=0.5, what="a charge per served request")
    assert sorted(m.idempotency_key for m in charges) == sorted(f"usage:{r}" for r in costs)
    assert all(-m.amount == costs[m.idempotency_key.removeprefix("usage:")] for m in charges)
    account = account_of(tenant.id)
    assert account.balance == Decimal("100") - sum(costs.values(), Decimal(0))
    assert account.movements.aggregate(total=Sum("amount"))["total"] == account.balance
