"""The gateway's one door into keys: who calls (authenticate), whether they may now (admit), and
what they used (a Lease, admitted and settled once).

KeyGate owns what a gateway process keeps of keys: the key cache and the listener that keeps it
fresh, the limiter with its admission leases, and the ledger's half of settling (the usage
record goes to Redis with the refund, in one call, or to the spool when Redis does not take it).
The gateway calls only this; the modules behind it are the keys app's to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.billing.choices import UsageStatus
from apps.billing.ledger import MODEL_CHARS, UNRECORDED, USAGE_STREAM, UsageEvent
from apps.billing.services import balance_seed
from apps.keys.admission import admit
from apps.keys.authentication import authenticate, check_network, check_signature, check_usable
from apps.keys.choices import PriorityTier
from apps.keys.keycache import KeyCache, KeyRecord, invalidation_channel
from apps.keys.leases import LeaseBook
from apps.keys.limiter import Limiter
from apps.keys.ratelimit import Admission, Once
from apps.keys.selectors import key_record_load
from dmxplatform.background import cancel_all
from dmxplatform.redis_client import async_redis
from dmxplatform.resp import ClusterRespClient, RedisUnavailable, RespClient, RespError
from dmxplatform.responses import header
from dmxplatform.spool import Spool

__all__ = [
    "MODEL_CHARS",
    "Admission",
    "Entry",
    "KeyGate",
    "KeyRecord",
    "Lease",
    "PriorityTier",
    "UsageEvent",
    "UsageStatus",
]

logger = logging.getLogger(__name__)

# After Redis is lost, the invalidation listener waits this long before subscribing again, s.
RECONNECT_DELAY = 1.0
# A stream entry to append with the settlement: (stream key, encoded entry).
Entry = tuple[str, bytes]
# A request's usage record and its other streams' entries, from the exception that ended it
# (None: it was answered in full).
UsageOf = Callable[[BaseException | None], tuple[UsageEvent, tuple[Entry, ...]]]


class KeyGate:
    def __init__(
        self,
        redis: RespClient,
        request_redis: RespClient | ClusterRespClient,
        *,
        spool: Spool,
    ) -> None:
        """`redis`: the coordination Redis (the key cache); `request_redis`: the request store
        (limits, leases, the ledger's streams)."""
        self._spool = spool
        # Database reads run through database_sync_to_async, which drops connections the server
        # closed (an outage, a failover) before and after each call; a plain thread would keep a
        # dead connection, and every later reload would fail.
        self.keys = KeyCache(
            redis=redis,
            load=database_sync_to_async(key_record_load),
            ttl=settings.DMX_KEY_CACHE_TTL_SECONDS,
        )
        self.limiter = Limiter(
            request_redis,
            LeaseBook(
                requests=settings.DMX_ADMISSION_LEASE_REQUESTS,
                ttl=settings.DMX_ADMISSION_LEASE_MS / 1000,
            ),
        )
        self._listener = async_redis(blocking=True)
        self._tasks: list[asyncio.Task] = []
        self._balance_seed = database_sync_to_async(balance_seed)

    def start(self) -> None:
        """Start keeping the cache fresh (key changes published by the keys app) and, with
        leases on, giving back what expired leases left unused."""
        self._tasks = [asyncio.create_task(self._invalidation_loop(), name="dmx-invalidation")]
        if settings.DMX_ADMISSION_LEASE_REQUESTS:
            self._tasks.append(asyncio.create_task(self._lease_loop(), name="dmx-leases"))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        try:
            await self.limiter.end_leases(everything=True)
        except (RedisUnavailable, RespError) as exc:
            logger.warning("leases not given back: %s", exc)
        await self._listener.aclose()

    async def authenticate(
        self,
        scope: dict[str, Any],
        body: bytes,
        *,
        address: str | None,
        acting_for: KeyRecord | None = None,
    ) -> tuple[KeyRecord, str | None]:
        """The key a request may use and, for a signing key, its signature (the nonce the
        limiter remembers against replays).

        `acting_for`: the key a caller inside the platform acts for, its user already signed in
        (the portal's playground); signatures prove a client holds the key's secrets, which the
        portal never has, so such a call is not asked for one. `address`: the client's, for the
        key's allowed networks."""
        if acting_for is None:
            key = await authenticate(self.keys, header(scope, b"authorization"))
            nonce = check_signature(key, scope, body)
        else:
            key, nonce = acting_for, None
            check_usable(key, time.time())
        check_network(key, address)
        return key, nonce

    async def key(self, authorization: bytes | None) -> KeyRecord:
        """The key of a bearer token alone (for reads that reserve nothing: /v1/models)."""
        return await authenticate(self.keys, authorization)

    def lease(
        self,
        key: KeyRecord,
        *,
        request_id: str,
        usage: UsageOf,
        once: bool = False,
    ) -> Lease:
        """A request's hold on `key`, as an async context manager that settles exactly once
        when its block ends (see Lease); `usage` gives the request's usage record (and other
        streams' records of it) from what ended the block. `once`: the request may run again
        under its id (a batch line), and only its first try to settle counts against the key."""
        return Lease(self, key, request_id, usage, once)

    async def seed_balance(self, tenant_id: int) -> int:
        """Give Redis a prepaid balance it does not hold, from the book of record; without the
        database (or Redis, which the seed writes) it cannot be known, and the request is
        refused as without Redis."""
        try:
            return await self._balance_seed(tenant_id)
        except (DatabaseError, RedisError) as exc:
            raise RedisUnavailable(f"prepaid balance of tenant {tenant_id} unknown: {exc}") from exc

    def keep(self, request_id: str, entries: list[Entry]) -> None:
        """Redis did not take a request's stream entries: spool them for the runtime to replay;
        should the disk refuse too, log the usage record whole, for `manage.py usage_replay`."""
        try:
            self._spool.append(entries)
        except OSError as exc:
            _, usage = entries[0]  # settle() puts the usage record first
            logger.error("%s %s", UNRECORDED, usage.decode())
            logger.error(
                "request %s: stream entries neither in Redis nor spooled: %s", request_id, exc
            )
        else:
            logger.warning("request %s: Redis did not take its usage record; spooled", request_id)

    async def _lease_loop(self) -> None:
        """Give back what expired leases left unused, twice per lease lifetime."""
        while True:
            await asyncio.sleep(settings.DMX_ADMISSION_LEASE_MS / 2000)
            try:
                await self.limiter.end_leases()
            except (RedisUnavailable, RespError) as exc:
                logger.warning("leases not given back: %s", exc)

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


class Lease:
    """One request's hold on its key: what admit() reserved against the key's limits, given
    back by the settle call, which also appends the request's usage record, exactly once.

    Whoever answers the request calls submit() before the answer's last bytes: the settle call
    is then in the kernel's socket to Redis (RespClient.submit), so an answer a client received
    cannot lose its record to a crash of this process. The block's exit makes the call if that
    did not happen (an error, the client gone, a cancellation: `usage` is given the exception),
    then waits for Redis's answer, after the answer to the client instead of holding it back a
    round trip, and spools the record if Redis failed the call.
    """

    __slots__ = (
        "_admission",
        "_call",
        "_entries",
        "_gate",
        "_key",
        "_money",
        "_once",
        "_request_id",
        "_reserved",
        "_usage",
    )

    def __init__(
        self,
        gate: KeyGate,
        key: KeyRecord,
        request_id: str,
        usage: UsageOf,
        once: bool = False,
    ) -> None:
        self._gate = gate
        self._key = key
        self._request_id = request_id
        self._usage = usage
        self._once = once
        self._admission: Admission | None = None
        self._reserved = 0
        self._money = 0
        self._entries: list[Entry] = []
        self._call: asyncio.Future | None = None

    async def admit(
        self, *, model: str, reserve: int, money: int = 0, nonce: str | None
    ) -> Admission:
        """Reserve `reserve` tokens, `money` (the request's worst-case cost, micro-units) and a
        request against every limit and budget of the key and its tenant's prepaid balance, or
        raise the refusal (429, or 503 without Redis) in OpenAI's shape."""
        self._admission = await admit(
            self._gate.limiter,
            request_id=self._request_id,
            key=self._key,
            model=model,
            reserve=reserve,
            money=money,
            nonce=nonce,
            seed=self._gate.seed_balance,
        )
        self._reserved = reserve
        self._money = money
        return self._admission

    @property
    def submitted(self) -> bool:
        return self._call is not None

    async def submit(self) -> None:
        """Settle now, the request answered in full: return once the call is on its way."""
        call = self._start(None)
        with contextlib.suppress(Exception):  # a failed call is the exit's to keep
            await asyncio.shield(call)

    def _start(self, ended_by: BaseException | None) -> asyncio.Future:
        """The settle call, started now unless it was."""
        if self._call is not None:
            return self._call
        usage, entries = self._usage(ended_by)
        admission = self._admission
        refund = self._reserved - usage.prompt_tokens - usage.completion_tokens
        money = self._money - usage.cost_micros
        events = self._entries = [
            (USAGE_STREAM.of_tenant(usage.tenant_id).key(), usage.encode()),
            *entries,
        ]
        once = None
        if self._once:
            once = Once.of(self._key.tenant_id, self._request_id, self._reserved, self._money)
        # A task of its own, so that a caller cancelled meanwhile (the client left, the time ran
        # out) cannot cancel the call halfway and drop the record: the exit waits for it.
        self._call = asyncio.ensure_future(
            self._gate.limiter.submit_settle(
                admission, refund=refund, events=events, money=money, once=once
            )
        )
        return self._call

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, kind, ended_by, traceback) -> None:
        call = self._start(ended_by)
        try:
            await (await call)
        except BaseException as exc:
            # Maybe appended, maybe not: a replay of one that was is stored once.
            self._gate.keep(self._request_id, self._entries)
            if not isinstance(exc, Exception):
                raise  # cancelled: the record is kept, the cancellation goes on
