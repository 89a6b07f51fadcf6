"""Redis connections and key names, shared by every app."""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio as aioredis
from django.conf import settings

from dmxplatform.resp import RespClient


def rkey(*parts: object) -> str:
    """Return a Redis key under this deployment's prefix: rkey("fleet", "nodes")."""
    return ":".join((settings.DMX_REDIS_PREFIX, *map(str, parts)))


@cache
def sync_redis() -> redis.Redis:
    """Return the process-wide client for services, Celery tasks and the admin."""
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=settings.DMX_REDIS_TIMEOUT * 5,
        socket_connect_timeout=settings.DMX_REDIS_TIMEOUT,
        health_check_interval=30,
    )


def async_redis(*, blocking: bool = False) -> aioredis.Redis:
    """Return a new asyncio client; each event loop (gateway process) keeps its own.

    `blocking` clients (pub/sub listeners) wait on reads indefinitely; all others time out.
    """
    return aioredis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=None if blocking else settings.DMX_REDIS_TIMEOUT,
        socket_connect_timeout=settings.DMX_REDIS_TIMEOUT,
        health_check_interval=30,
    )


def resp_client() -> RespClient:
    """Return a new lean client for the request path (dmxplatform.resp), one per event loop."""
    return RespClient(settings.REDIS_URL, timeout=settings.DMX_REDIS_TIMEOUT)
