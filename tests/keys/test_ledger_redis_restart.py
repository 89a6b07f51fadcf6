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

import pytest
from django.db import connection

from tests.conftest import _database_url
from tests.faults import OwnRedis, Sent, assert_recorded_once, send_chat
from tests.keys.factories import make_api_key
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


def test_usage_survives_a_redis_restart_under_load(
    platform, committed, private_stack, own_redis, tmp_path
):
    api_url = private_stack.gateways[0] + "/v1"
    wait_for(
        lambda: send_chat(api_url, platform.api_key, BODY).status == 200,
        timeout=120,
        interval=0.5,
        what="the private gateway to serve",
    )
    api_key, key = make_api_key()  # no limits: admitted without Redis
    sent: list[Sent] = []
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
                    outage["served"] = outage.get("served", 0) + (reply.status == 200)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
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

    assert outage.get("served", 0) > 0, "requests were served while Redis was down"
    assert sum(s.status == 200 for s in sent) >= 0.9 * len(sent), [s.status for s in sent]
    assert_recorded_once(sent, key=api_key, timeout=60)
    # Nothing is left for a person to do: the spool was replayed and emptied.
    spool = tmp_path / "spool"
    assert not [p for p in spool.glob("*") if p.stat().st_size], list(spool.glob("*"))
