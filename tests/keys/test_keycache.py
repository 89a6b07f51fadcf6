"""The gateway's key cache: memory, then Redis, then the database loader; push invalidation."""

import asyncio
import functools

import pytest

from apps.keys.keycache import KeyCache, KeyRecord, record_key
from dmxplatform.redis_client import resp_client, sync_redis
from tests.keys.factories import make_key_record, run_with_redis

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")


record = make_key_record
run = functools.partial(run_with_redis, client=resp_client)  # the key cache's Redis


def test_miss_loads_once_writes_through_and_serves_from_memory():
    loads = []

    async def load(key_id):
        loads.append(key_id)
        return record(key_id)

    async def scenario(redis):
        cache = KeyCache(redis=redis, load=load, ttl=60)
        first = await cache.get("abcdefgh")
        written = KeyRecord.decode(await redis.execute("GET", record_key("abcdefgh")))
        await redis.execute("DEL", record_key("abcdefgh"))  # memory alone must answer now
        second = await cache.get("abcdefgh")
        return first, written, second

    first, written, second = run(scenario)
    assert first == written == second == record("abcdefgh")
    assert loads == ["abcdefgh"]


def test_redis_copy_spares_the_database():
    sync_redis().set(record_key("fromredi"), record("fromredi", name="from redis").encode())

    async def load(key_id):
        raise AssertionError("the database must not be asked")

    async def scenario(redis):
        return await KeyCache(redis=redis, load=load, ttl=60).get("fromredi")

    assert run(scenario).name == "from redis"


def test_unknown_ids_are_remembered_so_floods_do_not_reach_the_database():
    loads = []

    async def load(key_id):
        loads.append(key_id)
        return None

    async def scenario(redis):
        a = KeyCache(redis=redis, load=load, ttl=60)
        b = KeyCache(redis=redis, load=load, ttl=60)  # another gateway process
        return await a.get("nosuchid"), await b.get("nosuchid")

    assert run(scenario) == (None, None)
    assert loads == ["nosuchid"]


def test_invalidation_drops_the_memory_copy():
    async def load(key_id):
        return record(key_id)

    async def scenario(redis):
        cache = KeyCache(redis=redis, load=load, ttl=60)
        await cache.get("abcdefgh")
        await redis.execute("SET", record_key("abcdefgh"), record(revoked=True).encode())
        stale = await cache.get("abcdefgh")
        cache.invalidate("apikey:abcdefgh")
        fresh = await cache.get("abcdefgh")
        return stale, fresh

    stale, fresh = run(scenario)
    assert stale.revoked is False and fresh.revoked is True


def test_ttl_bounds_staleness_without_invalidation():
    async def load(key_id):
        return record(key_id)

    async def scenario(redis):
        cache = KeyCache(redis=redis, load=load, ttl=0.05)
        await cache.get("abcdefgh")
        await redis.execute("SET", record_key("abcdefgh"), record(name="edited").encode())
        await asyncio.sleep(0.1)
        return await cache.get("abcdefgh")

    assert run(scenario).name == "edited"


def test_record_rules():
    assert record(allowed_models=()).allows("anything")
    assert not record(allowed_models=("a",)).allows("b")
    assert record(expires_at=100.0).expired(100.0)
    assert not record(expires_at=None).expired(1e12)
