"""What a gateway process checks as it starts."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.gateway.runtime import GatewayRuntime
from tests.faults import OwnRedis


def check(settings, redis: OwnRedis, *, required: bool):
    settings.REDIS_URL = redis.url
    settings.DMX_REDIS_REQUIRE_AOF = required

    async def scenario():
        runtime = GatewayRuntime()
        try:
            await runtime._check_persistence()
        finally:
            await runtime.redis.aclose()
            await runtime.fast_redis.close()

    asyncio.run(scenario())


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
