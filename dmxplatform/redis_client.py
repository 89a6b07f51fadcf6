"""Redis connections and key names, shared by every app.

Two roles (dmxplatform.settings.redis): the coordination Redis (sync_redis, async_redis,
resp_client) and the request store (request_redis, request_resp_client), which may be a Redis
Cluster. Keys in the request store that one script touches together carry the same hash tag
(tenant_rkey), so that no command ever crosses slots.
"""

from __future__ import annotations

from functools import cache

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from dmxplatform.resp import ClusterRespClient, RespClient, seed_nodes

# What a redis-py call may raise when Redis (or a cluster's master, or all of them) is away:
# redis-py's cluster errors are not RedisErrors.
REDIS_ERRORS = (RedisError, RedisClusterException)


def rkey(*parts: object) -> str:
    """Return a Redis key under this deployment's prefix: rkey("fleet", "nodes")."""
    return ":".join((settings.DMX_REDIS_PREFIX, *map(str, parts)))


def shard_of(tenant_id: int) -> int:
    """The request-store shard of a tenant: its limits' slot and its streams."""
    return tenant_id % settings.DMX_REQUEST_REDIS_SHARDS


def shard_tag(shard: int) -> str:
    """A shard's hash tag: Redis Cluster hashes only what is inside the braces."""
    return f"{{s{shard}}}"


def tenant_rkey(tenant_id: int, *parts: object) -> str:
    """A request-store key of a tenant's, in its shard's slot: tenant_rkey(7, "rl", "t", 7)."""
    return rkey(shard_tag(shard_of(tenant_id)), *parts)


# The sync clients' timeouts: a drain's or the admin's call may move more than a request's.
def _sync_timeouts() -> dict[str, float]:
    return {
        "socket_timeout": settings.DMX_REDIS_TIMEOUT * 5,
        "socket_connect_timeout": settings.DMX_REDIS_TIMEOUT,
    }


def _sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, health_check_interval=30, **_sync_timeouts())


@cache
def sync_redis() -> redis.Redis:
    """Return the process-wide client for services, Celery tasks and the admin."""
    return _sync_client(settings.REDIS_URL)


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
    """Return a new lean client of the coordination Redis for the request path (the key cache;
    dmxplatform.resp), one per event loop."""
    return RespClient(settings.REDIS_URL, timeout=settings.DMX_REDIS_TIMEOUT)


def request_resp_client(coordination: RespClient | None = None) -> RespClient | ClusterRespClient:
    """Return a new lean client of the request store (limits, breakers, streams), one per
    event loop; or `coordination`, this loop's client of the coordination Redis, where the
    request store is that same Redis (the default): one connection, so that a loop turn's
    commands leave in one write."""
    if settings.DMX_REQUEST_REDIS_CLUSTER:
        return ClusterRespClient(settings.DMX_REQUEST_REDIS_URL, timeout=settings.DMX_REDIS_TIMEOUT)
    if coordination is not None and settings.DMX_REQUEST_REDIS_URL == settings.REDIS_URL:
        return coordination
    return RespClient(settings.DMX_REQUEST_REDIS_URL, timeout=settings.DMX_REDIS_TIMEOUT)


def request_redis() -> redis.Redis | RedisCluster:
    """Return the process-wide client of the request store for services, Celery tasks and the
    admin (the ledger's drains, quota reads, breakers)."""
    return _request_redis(settings.DMX_REQUEST_REDIS_URL, settings.DMX_REQUEST_REDIS_CLUSTER)


@cache
def _request_redis(url: str, cluster: bool) -> redis.Redis | RedisCluster:
    if not cluster:
        if url == settings.REDIS_URL:
            return sync_redis()
        return _sync_client(url)
    nodes, username, password = seed_nodes(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        # As the servers run: a master that is down fails its own slots, not every one.
        require_full_coverage=False,
        **_sync_timeouts(),
    )


def request_mget(keys: list[str]) -> list[bytes | None]:
    """GET many request-store keys in one call per slot (a cluster refuses a cross-slot MGET)."""
    client = request_redis()
    if isinstance(client, RedisCluster):
        return client.mget_nonatomic(keys)
    return client.mget(keys)
