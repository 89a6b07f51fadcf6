"""Per-process gateway state: connections, caches, and the tasks that keep them fresh.

Started by the ASGI lifespan (or by the first request where a server sends none) and shared by
every request of the process: the keys app's gate (key cache, limiter, ledger), routing's
dispatcher (catalog, routing table, fleet, breakers, queue), the content filter, the pooled
upstream client and the spool. Nothing here is per request: the request path reads memory and
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
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError

from apps.billing.pricing import PRICES_VERSION, PriceBook, price_book_load
from apps.gateway import intent, tracing
from apps.gateway.content_filter import ContentFilter
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.selectors import content_filter_load
from apps.gateway.services import CONTENT_FILTER_VERSION
from apps.gateway.stored import ResponseStore
from apps.gateway.upstream_http import HttpPool
from apps.keys.errors import KeysErrorCode
from apps.keys.gate import KeyGate
from apps.routing.dispatcher import Dispatcher
from dmxplatform import metrics, streams
from dmxplatform.background import cancel_all
from dmxplatform.clients import trusted_networks
from dmxplatform.errors import RateLimitError, ServiceUnavailableError
from dmxplatform.memory import release_memory
from dmxplatform.redis_client import async_redis, request_resp_client, resp_client
from dmxplatform.resp import RedisUnavailable, RespError
from dmxplatform.spool import Spool, replay
from dmxplatform.versioned import reloaded

logger = logging.getLogger(__name__)
T = TypeVar("T")

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
# In /metrics from the start, so that rate() and alerts see the first refusal.
_LARGE_BODY_REFUSALS = metrics.gateway_refusals.labels("large_body")


class GatewayRuntime:
    def __init__(self) -> None:
        self.redis = async_redis()  # background work: refreshes
        # The request path (dmxplatform.resp): the key cache's coordination Redis, and the
        # request store of limits, breakers and streams (dmxplatform.settings.redis).
        self.fast_redis = resp_client()
        self.request_redis = request_resp_client(self.fast_redis)
        self.spool = Spool(Path(settings.DMX_SPOOL_DIR))
        self.gate = KeyGate(self.fast_redis, self.request_redis, spool=self.spool)
        self.dispatcher = Dispatcher(self.request_redis)
        self.responses = ResponseStore(self.request_redis)
        self.prices = PriceBook()
        self.content_filter = ContentFilter((), version=-1)
        self.trusted_proxies = trusted_networks(tuple(settings.DMX_TRUSTED_PROXIES))
        self.http: HttpPool | None = None
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
        await self._record_shards()
        await sync_to_async(intent.load, thread_sensitive=False)()
        tracing.prepare()  # OpenTelemetry's imports now, not in the first request's way
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        await self.refresh()
        # Everything loaded so far (Django, the intent weights' owners, the filter's automaton,
        # the caches) lives as long as the process: move it out of the collector's generations,
        # so that each full collection walks only what requests allocate.
        gc.collect()
        gc.freeze()
        self.gate.start()
        self._tasks = [
            asyncio.create_task(self._refresh_loop(), name="dmx-state-refresh"),
            asyncio.create_task(self._spool_loop(), name="dmx-spool"),
        ]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self.http is not None:
            await self.http.close()
        self._large.shutdown(wait=False, cancel_futures=True)
        await self.gate.stop()
        self.spool.close()
        await self.redis.aclose()
        await self.fast_redis.close()
        await self.request_redis.close()  # nothing left to close when it is fast_redis

    async def _check_persistence(self) -> None:
        """Refuse (or, with DMX_REDIS_REQUIRE_AOF off, warn about) a request store that keeps
        no append-only file (on any master): a restart of it would lose the usage records in
        its streams. A master that cannot tell (CONFIG turned off, as managed Redis services do;
        a cluster's master away or still loading) is left unchecked, with a warning: one master
        away must not keep the gateway from serving the others' tenants. None reachable at all
        fails the start, as there is no request store to serve with."""
        replies = await self.request_redis.each_master(b"CONFIG", b"GET", b"appendonly")
        answered = [reply for reply in replies if not isinstance(reply, Exception)]
        failed = [reply for reply in replies if isinstance(reply, Exception)]
        if not answered and all(isinstance(error, RedisUnavailable) for error in failed):
            raise failed[0]
        if failed:
            logger.warning(
                "%d of %d request-store masters unchecked for AOF (make sure they are): %s",
                len(failed),
                len(replies),
                failed[0],
            )
        if all(reply[1:] == [b"yes"] for reply in answered):
            return
        message = (
            "the Redis at DMX_REQUEST_REDIS_URL keeps no append-only file (appendonly no), so a "
            "restart of it loses the usage records waiting in its streams: run it with "
            "appendonly yes"
        )
        if settings.DMX_REDIS_REQUIRE_AOF:
            raise ImproperlyConfigured(message + " (or set DMX_REDIS_REQUIRE_AOF=0)")
        logger.warning(message)

    async def _record_shards(self) -> None:
        """Tell the drains which shards' streams this gateway writes (streams.shards_in_use)."""
        try:
            seen = await streams.record_shards(self.request_redis)
        except (RedisUnavailable, RespError) as exc:
            logger.warning("could not record this gateway's request-store shards: %s", exc)
            return
        if seen > settings.DMX_REQUEST_REDIS_SHARDS:
            logger.info(
                "a gateway ran with %d request-store shards (DMX_REQUEST_REDIS_SHARDS=%d here): "
                "their streams are drained too",
                seen,
                settings.DMX_REQUEST_REDIS_SHARDS,
            )

    async def refresh(self) -> None:
        """Reload routing's state (nodes, breakers, catalog, routing table) and rebuild the
        content filter and the price book when their versions moved (off the event loop: they
        read the database)."""
        await self.dispatcher.refresh(self.redis)
        self.content_filter = await reloaded(
            self.content_filter,
            await self.redis.get(CONTENT_FILTER_VERSION.key),
            lambda version: content_filter_load(version=version),
        )
        self.prices = await reloaded(
            self.prices, await self.redis.get(PRICES_VERSION.key), price_book_load
        )

    async def off_loop(self, work: Callable[[], T], *, owner: int) -> T:
        """Run a large request's CPU work in the worker thread, then give the memory it
        used back to the system (glibc keeps freed blocks of a big parse and tokenization
        otherwise: an 8 MB prompt once left the process 900 MB larger).

        The thread is the process's, shared by every key: at most DMX_LARGE_BODY_QUEUE
        requests wait for it (more get 503) and at most DMX_LARGE_BODY_PER_KEY of them are
        one key's (more get 429), so that one client's megabytes cannot hold back everyone's."""
        if self._large_owners[owner] >= settings.DMX_LARGE_BODY_PER_KEY:
            _LARGE_BODY_REFUSALS.inc()
            raise RateLimitError(
                f"Too many large requests of this key at once (at most "
                f"{settings.DMX_LARGE_BODY_PER_KEY}). Please retry when one has finished.",
                code=KeysErrorCode.RATE_LIMIT_EXCEEDED,
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            )
        if self._large_owners.total() >= settings.DMX_LARGE_BODY_QUEUE:
            _LARGE_BODY_REFUSALS.inc()
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

    async def readiness(self) -> dict[str, Any]:
        """Whether this process can serve now: Redis answers and the fleet state it routes on is
        fresh. The database is not asked: serving goes on without it (the ledger waits in
        Redis), so its outage must not take every gateway out of a load balancer."""
        try:
            async with asyncio.timeout(READINESS_REDIS_TIMEOUT_SECONDS):
                await self.fast_redis.execute(b"PING")
                if self.request_redis is not self.fast_redis:
                    await self.request_redis.execute(b"PING")
            redis = "ok"
        except (TimeoutError, RedisUnavailable, RespError, OSError) as exc:
            redis = f"error: {exc.__class__.__name__}"
        read_at = self.dispatcher.fleet_read_at
        age = None if read_at is None else time.monotonic() - read_at
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

    async def _spool_loop(self) -> None:
        """Put spooled stream entries (this process's and dead processes') on their streams
        whenever Redis answers."""
        while True:
            try:
                if self.spool.pending():
                    await replay(self.spool, self.request_redis, field=streams.FIELD)
            except (RespError, OSError) as exc:
                logger.warning("spooled entries wait: %s", exc)
            except Exception:
                logger.exception("spool replay failed")
            await asyncio.sleep(settings.DMX_SPOOL_REPLAY_SECONDS)


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
