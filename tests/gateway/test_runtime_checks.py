"""What a gateway process checks as it starts."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.gateway.runtime import GatewayRuntime
from dmxplatform.resp import RedisUnavailable
from tests.faults import OwnRedis


def run_start_step(step: str) -> None:
    """One step of a fresh gateway runtime's start (`_check_persistence`, `_record_shards`), as
    settings stand."""

    async def scenario():
        runtime = GatewayRuntime()
        try:
            await getattr(runtime, step)()
        finally:
            await runtime.redis.aclose()
            await runtime.fast_redis.close()
            await runtime.request_redis.close()

    asyncio.run(scenario())


def run_persistence_check() -> None:
    """The start's check of the request store's persistence."""
    run_start_step("_check_persistence")


def check(settings, redis: OwnRedis, *, required: bool):
    settings.REDIS_URL = settings.DMX_REQUEST_REDIS_URL = redis.url
    settings.DMX_REDIS_REQUIRE_AOF = required
    run_persistence_check()


def test_a_redis_without_an_append_only_file_is_refused_unless_allowed(settings, tmp_path, caplog):
    """A restart of it would lose the usage records waiting in its streams."""
    volatile = OwnRedis(tmp_path / "volatile", appendonly=False).start()
    durable = OwnRedis(tmp_path / "durable").start()
    try:
        with pytest.raises(ImproperlyConfigured, match="appendonly"):
            check(settings, volatile, required=True)
        with caplog.at_level(logging.WARNING, logger="apps.gateway.runtime"):
            check(settings, volatile, required=False)
        assert "appendonly no" in caplog.text
        check(settings, durable, required=True)
    finally:
        volatile.kill()
        durable.kill()


def test_a_request_store_that_cannot_tell_is_left_unchecked_and_none_reachable_fails_the_start(
    settings, tmp_path, caplog
):
    """CONFIG turned off (as managed Redis services do) is a warning, not a refusal; a request
    store nobody can reach is no store to serve with, whatever its persistence."""
    managed = OwnRedis(
        tmp_path / "managed", appendonly=False, options=("--rename-command", "CONFIG", "hidden")
    ).start()
    settings.REDIS_URL = settings.DMX_REQUEST_REDIS_URL = managed.url
    settings.DMX_REDIS_REQUIRE_AOF = True
    try:
        with caplog.at_level(logging.WARNING, logger="apps.gateway.runtime"):
            run_persistence_check()
        assert "1 of 1 request-store masters unchecked for AOF" in caplog.text
    finally:
        managed.kill()
    with pytest.raises(RedisUnavailable):  # gone now: its port refuses
        run_persistence_check()
