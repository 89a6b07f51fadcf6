"""Stored responses (/v1/responses with `store`, OpenAI's default) on the request path.

A response that ends is kept twice, with no database on the request path:
- durably: its record rides in the request's settle call as an entry of RESPONSES_STREAM (no
  extra round trip), which `apps.gateway.services.stored_responses_flush` moves into
  StoredResponse a second or two later (dmxplatform.streams);
- hot: a copy in the tenant's Redis slot for DMX_RESPONSES_HOT_SECONDS, written before the
  answer's last bytes, so that the next turn (`previous_response_id`) and a background run's
  polls find it at once, before the drain has run.
Reads take the Redis copy, else the row (in a thread: a conversation older than the copy).
Deleting marks the response deleted in both: a marker in Redis that no later copy overwrites (a
background run may still be going), and the row emptied and marked in PostgreSQL, which keeps an
entry still in the stream from inserting it (the drain inserts only rows that do not exist).

A background response (`background: true`) is this process's request, answered `queued` at
once and run on by its pipeline (apps.gateway.pipeline): its events go to a Redis stream of its
own, which any gateway replica streams to a client (`GET ...?stream=true&starting_after=`), and
it watches a flag in Redis that `POST .../cancel` raises on any replica.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from apps.gateway.choices import ResponseStatus
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.response_records import ENDED, ResponseRecord, hot_key
from apps.gateway.selectors import stored_response_get
from apps.gateway.services import stored_response_delete
from dmxplatform.errors import InvalidRequestError, NotFoundError, ServiceUnavailableError
from dmxplatform.resp import ClusterRespClient, RespClient, Script

logger = logging.getLogger(__name__)

# An event stream's last entry: the stream's end, after which a reader stops.
_END_FIELD = b"end"
# What a stored response's id can be (the gateway's are resp_ and 32 hex digits).
_RESPONSE_ID = re.compile(r"resp_[0-9A-Za-z_-]{1,59}")


def not_found(response_id: str, param: str | None = None) -> NotFoundError:
    return NotFoundError(
        f"Response with id '{response_id}' not found.",
        param=param,
        code=GatewayErrorCode.RESPONSE_NOT_FOUND,
    )


# Appends a background run's events to its stream and answers whether it was cancelled, in one
# round trip. KEYS: events, cancel flag; ARGV: ttl ms, then one event per argument (the last
# may be the end marker, "").
_APPEND_EVENTS = Script(
    """
for index = 2, #ARGV do
  if ARGV[index] == '' then
    redis.call('XADD', KEYS[1], '*', 'end', '1')
  else
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[index])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('EXISTS', KEYS[2])
"""
)
# Writes a response's copy unless it was deleted: a background run still going when its response
# is deleted must not bring it back. KEYS: copy, deleted marker; ARGV: the record, ttl ms.
_KEEP = Script(
    """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)
# The database behind the copies answers within this, seconds, or the read is a 503: a slow
# database must not hold a request (or, through the thread pool, others) for long.
DATABASE_READ_TIMEOUT_SECONDS = 5.0
# How often a client streaming a background run checks that the run is still alive, seconds:
# a run whose process died writes no end to its stream.
LIVENESS_CHECK_SECONDS = 10.0


class ResponseStore:
    """The gateway's door to stored responses: the Redis copies and background runs' events
    and flags, the database behind them."""

    def __init__(self, redis: RespClient | ClusterRespClient) -> None:
        self._redis = redis
        # A thread of the pool per read, not the one thread Django's async calls share: a slow
        # database must not queue every tenant's reads behind one.
        self._load = database_sync_to_async(stored_response_get, thread_sensitive=False)
        self._mark_deleted = database_sync_to_async(stored_response_delete, thread_sensitive=False)

    @staticmethod
    def _ttl_ms() -> int:
        return settings.DMX_RESPONSES_HOT_SECONDS * 1000

    async def keep(self, record: ResponseRecord, payload: bytes | None = None) -> None:
        """Write (or overwrite) the record's Redis copy, unless the response was deleted;
        `payload`: the record encoded, where the caller has it already."""
        keys = [
            hot_key(record.tenant_id, record.id),
            hot_key(record.tenant_id, record.id, "deleted"),
        ]
        await self._redis.run(_KEEP, keys, [payload or record.encode(), self._ttl_ms()])

    async def get(self, response_id: str, tenant_id: int) -> ResponseRecord | None:
        """The tenant's response of that id, or None (another tenant's is None too)."""
        found = await self._fetch(response_id, tenant_id)
        return found[0] if found is not None else None

    async def _fetch(self, response_id: str, tenant_id: int) -> tuple[ResponseRecord, int] | None:
        """The tenant's response of that id, as a client should see it, and its stored size."""
        if not _RESPONSE_ID.fullmatch(response_id):  # nothing else was ever stored
            return None
        keys = (hot_key(tenant_id, response_id), hot_key(tenant_id, response_id, "deleted"))
        raw, deleted = await self._redis.execute("MGET", *keys)
        if deleted is not None:
            return None
        if raw is not None:
            found: tuple[ResponseRecord, int] | None = (ResponseRecord.decode(raw), len(raw))
        else:
            found = await self._database(self._load, response_id=response_id, tenant_id=tenant_id)
        if found is None or found[0].tenant_id != tenant_id:
            return None
        return found[0].as_of(time.time()), found[1]

    async def _database(self, call, **arguments: Any) -> Any:
        try:
            async with asyncio.timeout(DATABASE_READ_TIMEOUT_SECONDS):
                return await call(**arguments)
        except (TimeoutError, DatabaseError) as exc:
            logger.warning("stored responses: the database failed: %r", exc)
            raise ServiceUnavailableError(
                "Stored responses cannot be read now. Please retry shortly.",
                code=GatewayErrorCode.STATE_UNAVAILABLE,
                headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
            ) from None

    async def history(self, response_id: Any, tenant_id: int) -> tuple[ResponseRecord, int]:
        """The response a new turn continues (`previous_response_id`) and its stored size, or
        the 400/404 why not."""
        param = "previous_response_id"
        if not isinstance(response_id, str):
            raise InvalidRequestError(
                f"'{param}' must be a string.", param=param, code=GatewayErrorCode.INVALID_TYPE
            )
        found = await self._fetch(response_id, tenant_id)
        if found is None:
            raise not_found(response_id, param)
        record = found[0]
        if record.status not in ENDED or record.status == ResponseStatus.FAILED:
            raise InvalidRequestError(
                f"Response '{response_id}' is {record.status}: only a finished response can "
                "be continued.",
                param=param,
                code=GatewayErrorCode.RESPONSE_NOT_CONTINUABLE,
            )
        return found

    async def delete(self, record: ResponseRecord) -> None:
        """Delete a response: marked deleted in Redis (no copy is written again, a run still
        going is cancelled) and in the database (its row emptied, and an entry still in the
        stream kept from inserting it)."""
        tenant_id, response_id = record.tenant_id, record.id
        ttl = self._ttl_ms()
        await self._redis.execute(
            "SET", hot_key(tenant_id, response_id, "deleted"), b"1", "PX", ttl
        )
        await self._redis.execute("SET", hot_key(tenant_id, response_id, "cancel"), b"1", "PX", ttl)
        await self._redis.execute(
            "DEL", hot_key(tenant_id, response_id), hot_key(tenant_id, response_id, "events")
        )
        await self._database(self._mark_deleted, record=record)

    async def cancel(self, record: ResponseRecord) -> dict[str, Any]:
        """POST .../cancel: raise the flag a background run watches (whichever replica runs
        it) and answer the response cancelled, as it is once the run next looks; or the 400 why
        it cannot be."""
        if not record.background:
            raise InvalidRequestError(
                "Only responses created with 'background': true can be cancelled.",
                code=GatewayErrorCode.RESPONSE_NOT_CANCELLABLE,
            )
        if record.status == ResponseStatus.CANCELLED:
            return record.response
        if record.status in ENDED:
            raise InvalidRequestError(
                f"Cannot cancel a response that is {record.status}.",
                code=GatewayErrorCode.RESPONSE_NOT_CANCELLABLE,
            )
        key = hot_key(record.tenant_id, record.id, "cancel")
        await self._redis.execute("SET", key, b"1", "PX", self._ttl_ms())
        return {**record.response, "status": ResponseStatus.CANCELLED.value}

    async def cancelled(self, record: ResponseRecord) -> bool:
        key = hot_key(record.tenant_id, record.id, "cancel")
        return bool(await self._redis.execute("EXISTS", key))

    async def append(self, record: ResponseRecord, events: list[bytes], *, end: bool) -> bool:
        """Add a background run's events to its stream (with the end marker when `end`);
        return whether the run was cancelled."""
        keys = [hot_key(record.tenant_id, record.id, name) for name in ("events", "cancel")]
        args: list[Any] = [self._ttl_ms(), *events]
        if end:
            args.append(b"")
        return bool(await self._redis.run(_APPEND_EVENTS, keys, args))

    async def events(
        self, record: ResponseRecord, *, after: int, poll: float
    ) -> AsyncIterator[bytes]:
        """A background run's events numbered above `after`, as they come, to its end (or to
        the run's death: its record then reads failed, ResponseRecord.as_of)."""
        key = hot_key(record.tenant_id, record.id, "events")
        start, sequence = "-", -1
        checked = time.monotonic()
        while True:
            entries = await self._redis.execute("XRANGE", key, start, "+")
            for entry_id, fields in entries or ():
                start = b"(" + entry_id  # exclusive: the entries after this one
                values = dict(zip(fields[::2], fields[1::2], strict=True))
                if _END_FIELD in values:
                    return
                sequence += 1
                if sequence > after:
                    yield values[b"e"]
            if entries:
                continue
            if time.monotonic() - checked > LIVENESS_CHECK_SECONDS:
                checked = time.monotonic()
                fresh = await self.get(record.id, record.tenant_id)
                if fresh is None or fresh.status in ENDED:
                    return
            # Not XREAD BLOCK: the request path's client keeps one connection per loop, which
            # a blocking read would hold for everyone.
            await asyncio.sleep(poll)


# OpenAI's bounds on a page of input items.
ITEMS_PAGE_DEFAULT, ITEMS_PAGE_MAX = 20, 100


def input_item_page(record: ResponseRecord, query: dict[str, str]) -> dict[str, Any]:
    """GET /v1/responses/{id}/input_items: a page of the response's input items, as OpenAI
    pages them (`limit` 1-100, default 20; `order` desc by default; `after` an item's id)."""
    limit = query_int(query, "limit", ITEMS_PAGE_DEFAULT)
    if not 1 <= limit <= ITEMS_PAGE_MAX:
        raise InvalidRequestError(
            f"'limit' must be an integer from 1 to {ITEMS_PAGE_MAX}.",
            param="limit",
            code=GatewayErrorCode.INVALID_VALUE,
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError(
            "'order' must be 'asc' or 'desc'.", param="order", code=GatewayErrorCode.INVALID_VALUE
        )
    items = record.input_items if order == "asc" else record.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequestError(
                f"No input item with id '{after}' in this response.",
                param="after",
                code=GatewayErrorCode.INVALID_VALUE,
            )
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }


def query_int(query: dict[str, str], name: str, default: int) -> int:
    """A query parameter that must be an integer (ASCII digits, as a client sends one)."""
    text = query.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"-?[0-9]{1,18}", text):
        raise InvalidRequestError(
            f"'{name}' must be an integer.", param=name, code=GatewayErrorCode.INVALID_TYPE
        )
    return int(text)
