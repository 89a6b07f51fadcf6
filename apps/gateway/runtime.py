"""Per-process gateway state: connections, caches, and the tasks that keep them fresh.

Started by the ASGI lifespan (or by the first request where a server sends none) and shared by
every request of the process: key cache, model catalog, fleet view, content filter, limiter, the
pooled upstream client. Nothing here is per request: the request path reads memory and
makes at most the Redis and upstream calls it must.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError, ResponseError

from apps.gateway import intent, tracing
from apps.gateway.clients import trusted_networks
from apps.gateway.content_filter import ContentFilter
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.selectors import content_filter_load
from apps.gateway.services import CONTENT_FILTER_VERSION_KEY
from apps.gateway.upstream_http import HttpPool
from apps.hardware.fleet import NodeSnapshot, fleet_key
from apps.keys.errors import KeysErrorCode
from apps.keys.keycache import KeyCache, invalidation_channel
from apps.keys.leases import LeaseBook
from apps.keys.limiter import Limiter
from apps.keys.selectors import key_record_load
from apps.models.catalog import Catalog, ModelEntry
from apps.models.selectors import catalog_load
from apps.models.services import CATALOG_VERSION_KEY
from apps.routing.breaker import (
    BreakerBoard,
    BreakerState,
    breakers_key,
    slow_first_token,
    slow_ttft_limit_ms,
)
from apps.routing.decisions import DecisionSampler
from apps.routing.fleet import FleetView
from apps.routing.queueing import AdmissionQueues
from apps.routing.router import Router
from apps.routing.selectors import routing_table_load
from apps.routing.services import ROUTING_TABLE_VERSION_KEY
from apps.routing.stats import GatewayStats
from apps.routing.table import RoutingTable
from dmxplatform import metrics, streams
from dmxplatform.errors import RateLimitError, ServiceUnavailableError
from dmxplatform.memory import release_memory
from dmxplatform.redis_client import async_redis, resp_client, rkey
from dmxplatform.resp import RedisUnavailable, RespError
from dmxplatform.spool import Spool, replay

logger = logging.getLogger(__name__)
T = TypeVar("T")

# After a Redis error the background loops wait this long before trying again, seconds.
RECONNECT_DELAY = 1.0
# /readyz's PING gives up after this: a probe must answer well inside a load balancer's timeout.
READINESS_REDIS_TIMEOUT_SECONDS = 1.0
# While the worker thread runs Python (a large prompt's screening), the event loop waits at most
# this long for the GIL, seconds; CPython's default, 5 ms, would add that to other requests at
# every hand-over. With one thread busy there is no contention and the value costs nothing.
GIL_SWITCH_INTERVAL = 0.001
# The large-request thread's nice value: about a tenth of a core against a busy event loop. At
# 19 (a seventieth) small requests' p99 was no better within the noise (bench/large_prompts.py),
# but a 1.2 MB prompt on a saturated core took 22 s instead of 7.
LARGE_REQUEST_NICE = 10


class GatewayRuntime:
    def __init__(self) -> None:
        self.redis = async_redis()  # background work: refreshes
        self.fast_redis = resp_client()  # the request path (dmxplatform.resp)
        self._listener = async_redis(blocking=True)
        self.fleet = FleetView(stale_after=settings.DMX_NODE_STALE_SECONDS)
        # When the fleet state was last read from Redis (monotonic); /readyz judges on it.
        self.refreshed_at: float | None = None
        self.catalog = Catalog()
        # Database reads run through database_sync_to_async, which drops connections the server
        # closed (an outage, a failover) before and after each call; a plain thread would keep a
        # dead connection, and every later reload would fail.
        self.keys = KeyCache(
            redis=self.fast_redis,
            load=database_sync_to_async(key_record_load),
            ttl=settings.DMX_KEY_CACHE_TTL_SECONDS,
        )
        self.limiter = Limiter(
            self.fast_redis,
            LeaseBook(
                requests=settings.DMX_ADMISSION_LEASE_REQUESTS,
                ttl=settings.DMX_ADMISSION_LEASE_MS / 1000,
            ),
        )
        self.content_filter = ContentFilter(())
        self.content_filter_version = -1
        self.routing_table = RoutingTable()
        self.breakers = BreakerBoard(self.fast_redis)
        self.stats = GatewayStats()
        self.queues = AdmissionQueues()
        self.router = Router(fleet=self.fleet, breakers=self.breakers, stats=self.stats)
        self.decision_sampler = DecisionSampler(settings.DMX_DECISION_LOG_PER_SECOND)
        self.trusted_proxies = trusted_networks(tuple(settings.DMX_TRUSTED_PROXIES))
        self.http: HttpPool | None = None
        self.spool = Spool(Path(settings.DMX_SPOOL_DIR))
        # One thread for large prompts' CPU work: they wait for each other, not for the loop.
        self._large = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dmx-large-request", initializer=_lower_priority
        )
        self._large_owners: Counter[int] = Counter()  # large requests waiting or running, by key
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.http = HttpPool(
            connect_timeout=settings.DMX_UPSTREAM_CONNECT_TIMEOUT,
            read_timeout=settings.DMX_UPSTREAM_READ_TIMEOUT,
            max_idle_per_node=settings.DMX_UPSTREAM_POOL_PER_NODE,
        )
        await self._check_persistence()
        await sync_to_async(intent.load, thread_sensitive=False)()
        tracing.prepare()  # OpenTelemetry's imports now, not in the first request's way
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        await self.refresh()
        # Everything loaded so far (Django, the intent weights' owners, the filter's automaton,
        # the caches) lives as long as the process: move it out of the collector's generations,
        # so that each full collection walks only what requests allocate.
        gc.collect()
        gc.freeze()
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="dmx-state-refresh"),
            asyncio.create_task(self._invalidation_loop(), name="dmx-invalidation"),
        ]
        if settings.DMX_ADMISSION_LEASE_REQUESTS:
            self._tasks.append(asyncio.create_task(self._lease_loop(), name="dmx-leases"))
        self._tasks.append(asyncio.create_task(self._spool_loop(), name="dmx-spool"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.http is not None:
            await self.http.close()
        self._large.shutdown(wait=False, cancel_futures=True)
        self.spool.close()
        try:
            await self.limiter.end_leases(everything=True)
        except (RedisUnavailable, RespError) as exc:
            logger.warning("leases not given back: %s", exc)
        await self.redis.aclose()
        await self.fast_redis.close()
        await self._listener.aclose()

    async def _check_persistence(self) -> None:
        """Refuse (or, with DMX_REDIS_REQUIRE_AOF off, warn about) a Redis that keeps no
        append-only file: a restart of it would lose the usage records in its streams."""
        try:
            appendonly = (await self.redis.config_get("appendonly")).get("appendonly")
        except ResponseError:
            logger.warning("cannot read Redis's persistence (CONFIG is off); make sure it is AOF")
            return
        if appendonly == "yes":
            return
        message = (
            "the Redis at REDIS_URL keeps no append-only file (appendonly no), so a restart of "
            "it loses the usage records waiting in its streams: run it with appendonly yes"
        )
        if settings.DMX_REDIS_REQUIRE_AOF:
            raise ImproperlyConfigured(message + " (or set DMX_REDIS_REQUIRE_AOF=0)")
        logger.warning(message)

    async def refresh(self) -> None:
        """Reload node state and breakers; rebuild the catalog, the content filter and the
        routing table when their versions moved (off the event loop: they read the database)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(fleet_key())
        pipe.hgetall(breakers_key())
        pipe.get(rkey(*CATALOG_VERSION_KEY))
        pipe.get(rkey(*CONTENT_FILTER_VERSION_KEY))
        pipe.get(rkey(*ROUTING_TABLE_VERSION_KEY))
        nodes, breakers, catalog_version, filter_version, table_version = await pipe.execute()
        self.refreshed_at = time.monotonic()
        self.fleet.replace(nodes)
        self.breakers.replace(breakers)
        self.queues.wake_all()  # fresh state may have room for whoever waits
        table_version = int(table_version or 0)
        if table_version != self.routing_table.version:
            self.routing_table = await database_sync_to_async(routing_table_load)(
                version=table_version
            )
        catalog_version = int(catalog_version or 0)
        if catalog_version != self.catalog.version:
            self.catalog = await database_sync_to_async(catalog_load)(
                version=catalog_version, previous=self.catalog
            )
            for model in self.catalog.models:  # a queue of 0 from the start, not no series
                metrics.gateway_queue_depth.labels(model)
        filter_version = int(filter_version or 0)
        if filter_version != self.content_filter_version:
            self.content_filter = await database_sync_to_async(content_filter_load)(
                version=filter_version
            )
            self.content_filter_version = filter_version

    async def off_loop(self, work: Callable[[], T], *, owner: int) -> T:
        """Run a large request's CPU work in the worker thread, then give the memory it
        used back to the system (glibc keeps freed blocks of a big parse and tokenization
        otherwise: an 8 MB prompt once left the process 900 MB larger).

        The thread is the process's, shared by every key: at most DMX_LARGE_BODY_QUEUE
        requests wait for it (more get 503) and at most DMX_LARGE_BODY_PER_KEY of them are
        one key's (more get 429), so that one client's megabytes cannot hold back everyone's."""
        if self._large_owners[owner] >= settings.DMX_LARGE_BODY_PER_KEY:
            metrics.gateway_refusals.labels("large_body").inc()
            raise RateLimitError(
                f"Too many large requests of this key at once (at most "
                f"{settings.DMX_LARGE_BODY_PER_KEY}). Please retry when one has finished.",
                code=KeysErrorCode.RATE_LIMIT_EXCEEDED,
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            )
        if self._large_owners.total() >= settings.DMX_LARGE_BODY_QUEUE:
            metrics.gateway_refusals.labels("large_body").inc()
            raise ServiceUnavailableError(
                "The gateway is busy with large requests. Please retry shortly.",
                code=GatewayErrorCode.NO_CAPACITY,
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            )

        def run() -> T:
            try:
                return work()
            finally:
                release_memory()

        loop = asyncio.get_running_loop()
        self._large_owners[owner] += 1
        # In the request's context: its log lines there carry its id too (dmxplatform.logs).
        submitted = self._large.submit(contextvars.copy_context().run, run)
        # Counted until the thread is done with it (or drops it unstarted), also when the caller
        # stopped waiting: the work goes on, and so does what it holds of the thread.
        submitted.add_done_callback(lambda _: loop.call_soon_threadsafe(self._large_done, owner))
        return await asyncio.wrap_future(submitted)

    def _large_done(self, owner: int) -> None:
        self._large_owners[owner] -= 1
        if not self._large_owners[owner]:
            del self._large_owners[owner]

    async def observe(
        self,
        node: NodeSnapshot,
        *,
        failed: bool,
        ttft_ms: float | None = None,
        latency_ms: float = 0.0,
        model: ModelEntry | None = None,
        prompt_tokens: int = 0,
        others_on_node: int = 0,
    ) -> None:
        """Feed a request's outcome on a node to the latency windows and its circuit breaker; a
        slow first token counts against the breaker only as breaker.slow_first_token says."""
        self.stats.record(node.id, ttft_ms=ttft_ms, latency_ms=latency_ms, failed=failed)
        slow = ttft_ms is not None and slow_first_token(
            ttft_ms=ttft_ms,
            limit_ms=slow_ttft_limit_ms(model.sla_ttft_p95_ms if model else None),
            prompt_tokens=prompt_tokens,
            others_on_node=others_on_node,
            healthy_alternatives=self._healthy_alternatives(node),
        )
        try:
            await self.breakers.record(node.id, failed=failed or slow)
        except (RedisError, OSError) as exc:
            logger.warning("breaker of node %s not updated: %s", node.name, exc)

    def _healthy_alternatives(self, node: NodeSnapshot) -> int:
        """Other live nodes of the node's model whose breaker is closed."""
        return sum(
            1
            for other in self.fleet.live_nodes(node.model)
            if other.id != node.id and self.breakers.state(other.id) is BreakerState.CLOSED
        )

    async def readiness(self) -> dict[str, Any]:
        """Whether this process can serve now: Redis answers and the fleet state it routes on is
        fresh. The database is not asked: serving goes on without it (the ledger waits in
        Redis), so its outage must not take every gateway out of a load balancer."""
        try:
            async with asyncio.timeout(READINESS_REDIS_TIMEOUT_SECONDS):
                await self.fast_redis.execute(b"PING")
            redis = "ok"
        except (TimeoutError, RedisUnavailable, RespError, OSError) as exc:
            redis = f"error: {exc.__class__.__name__}"
        age = None if self.refreshed_at is None else time.monotonic() - self.refreshed_at
        fresh = age is not None and age <= settings.DMX_NODE_STALE_SECONDS
        return {
            "ready": redis == "ok" and fresh,
            "redis": redis,
            "fleet_state_age_seconds": None if age is None else round(age, 3),
        }

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.DMX_STATE_REFRESH_SECONDS)
            try:
                await self.refresh()
            except (RedisError, OSError) as exc:
                logger.warning("state refresh failed: %s", exc)
            except Exception:
                logger.exception("state refresh failed")

    async def _lease_loop(self) -> None:
        """Give back what expired leases left unused, twice per lease lifetime."""
        while True:
            await asyncio.sleep(settings.DMX_ADMISSION_LEASE_MS / 2000)
            try:
                await self.limiter.end_leases()
            except (RedisUnavailable, RespError) as exc:
                logger.warning("leases not given back: %s", exc)

    async def _spool_loop(self) -> None:
        """Put spooled stream entries (this process's and dead processes') on their streams
        whenever Redis answers."""
        while True:
            try:
                if self.spool.pending():
                    await replay(self.spool, self.redis, field=streams.FIELD)
            except (RedisError, OSError) as exc:
                logger.warning("spooled entries wait: %s", exc)
            except Exception:
                logger.exception("spool replay failed")
            await asyncio.sleep(settings.DMX_SPOOL_REPLAY_SECONDS)

    async def _invalidation_loop(self) -> None:
        while True:
            try:
                async with self._listener.pubsub() as pubsub:
                    await pubsub.subscribe(invalidation_channel())
                    # Anything may have changed while we were not listening.
                    self.keys.clear()
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self.keys.invalidate(message["data"].decode())
            except (RedisError, OSError) as exc:
                logger.warning("invalidation listener lost Redis: %s", exc)
                await asyncio.sleep(RECONNECT_DELAY)


def _lower_priority() -> None:
    """Let the scheduler put this thread after the event loop (Linux: a thread's own nice
    value): on the loop's core, a large prompt's tokenizing (GIL released) then takes only the
    time the loop leaves."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LARGE_REQUEST_NICE)


_runtime: GatewayRuntime | None = None
_lock = asyncio.Lock()


async def get_runtime() -> GatewayRuntime:
    """Return the process's runtime, starting it on first use."""
    global _runtime
    if _runtime is None:
        async with _lock:
            if _runtime is None:
                runtime = GatewayRuntime()
                await runtime.start()
                _runtime = runtime
    return _runtime


async def shutdown_runtime() -> None:
    global _runtime
    if _runtime is not None:
        await _runtime.stop()
        _runtime = None
