"""Stored responses (/v1/responses with `store`, OpenAI's default) on the request path.

A response that ends is kept twice, with no database on the request path:
- durably: its record rides in the request's settle call as an entry of RESPONSES_STREAM (no
  extra round trip), which `apps.gateway.services.stored_responses_flush` moves into
  StoredResponse a second or two later (dmxplatform.streams);
- hot: a copy in the tenant's Redis slot for DMX_RESPONSES_HOT_SECONDS, written before the
  answer's last bytes, so that the next turn (`previous_response_id`) and a background run's
  polls find it at once, before the drain has run.
Reads take the Redis copy, else the row (in a thread: a conversation older than the copy).
Deleting removes both and leaves a tombstone in the copy's place, which keeps an entry still in
the stream from bringing the response back.

A background response (`background: true`) is this process's request, answered `queued` at
once and run on by its pipeline (apps.gateway.pipeline): its events go to a Redis stream of its
own, which any gateway replica streams to a client (`GET ...?stream=true&starting_after=`), and
it watches a flag in Redis that `POST .../cancel` raises on any replica.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from apps.gateway.choices import ResponseStatus
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.response_records import ENDED, TOMBSTONE, ResponseRecord, hot_key
from apps.gateway.selectors import stored_response_get
from apps.gateway.services import stored_response_delete
from dmxplatform.errors import InvalidRequestError, NotFoundError
from dmxplatform.resp import ClusterRespClient, RespClient, Script

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


class ResponseStore:
    """The gateway's door to stored responses: the Redis copies and background runs' events
    and flags, the database behind them."""

    def __init__(self, redis: RespClient | ClusterRespClient) -> None:
        self._redis = redis
        self._load = database_sync_to_async(stored_response_get)
        self._delete = database_sync_to_async(stored_response_delete)

    @staticmethod
    def _ttl_ms() -> int:
        return settings.DMX_RESPONSES_HOT_SECONDS * 1000

    async def keep(self, record: ResponseRecord) -> None:
        """Write (or overwrite) the record's Redis copy."""
        await self._redis.execute(
            "SET", hot_key(record.tenant_id, record.id), record.encode(),
            "PX", self._ttl_ms(),
        )  # fmt: skip

    async def get(self, response_id: str, tenant_id: int) -> ResponseRecord | None:
        """The tenant's response of that id, or None (another tenant's is None too)."""
        if not _RESPONSE_ID.fullmatch(response_id):  # nothing else was ever stored
            return None
        raw = await self._redis.execute("GET", hot_key(tenant_id, response_id))
        if raw == TOMBSTONE:
            return None
        record = (
            ResponseRecord.decode(raw)
            if raw is not None
            else await self._load(response_id=response_id, tenant_id=tenant_id)
        )
        if record is None or record.tenant_id != tenant_id:
            return None
        return record.as_of(time.time())

    async def history(self, response_id: Any, tenant_id: int) -> ResponseRecord:
        """The response a new turn continues (`previous_response_id`), or the 400/404 why not."""
        param = "previous_response_id"
        if not isinstance(response_id, str):
            raise InvalidRequestError(
                f"'{param}' must be a string.", param=param, code=GatewayErrorCode.INVALID_TYPE
            )
        record = await self.get(response_id, tenant_id)
        if record is None:
            raise not_found(response_id, param)
        if record.status not in ENDED or record.status == ResponseStatus.FAILED:
            raise InvalidRequestError(
                f"Response '{response_id}' is {record.status}: only a finished response can "
                "be continued.",
                param=param,
                code=GatewayErrorCode.RESPONSE_NOT_CONTINUABLE,
            )
        return record

    async def delete(self, response_id: str, tenant_id: int) -> bool:
        """Delete the tenant's response; False if it has none of that id."""
        found = await self.get(response_id, tenant_id) is not None
        if not found:
            return False
        key = hot_key(tenant_id, response_id)
        # The tombstone first: the drain skips an entry whose copy is one.
        await self._redis.execute("SET", key, TOMBSTONE, "PX", self._ttl_ms() * 2)
        await self._delete(response_id=response_id, tenant_id=tenant_id)
        await self._redis.execute(
            "DEL",
            hot_key(tenant_id, response_id, "events"),
            hot_key(tenant_id, response_id, "cancel"),
        )
        return True

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
        key = hot_key(record.tenant_id, record.id)
        args: list[Any] = [self._ttl_ms(), *events]
        if end:
            args.append(b"")
        return bool(await self._redis.run(_APPEND_EVENTS, [f"{key}:events", f"{key}:cancel"], args))

    async def events(
        self, record: ResponseRecord, *, after: int, poll: float
    ) -> AsyncIterator[bytes]:
        """A background run's events numbered above `after`, as they come, to its end."""
        key = hot_key(record.tenant_id, record.id, "events")
        start, sequence = "-", -1
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
            if record.status in ENDED and not entries:
                return
            # Not XREAD BLOCK: the request path's client keeps one connection per loop, which
            # a blocking read would hold for everyone.
            await asyncio.sleep(poll)
            fresh = await self.get(record.id, record.tenant_id)
            if fresh is None:
                return
            record = fresh


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
