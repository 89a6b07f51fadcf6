"""Background responses (/v1/responses with `background: true`): answered `queued` at once, then
run on by the request's own pipeline in this process, without its client.

Not Celery: a background response is a completion request whose client does not wait, and the
request path (limits at the key's tier, routing, the engine, billing what was generated) is the
gateway's; a Celery worker would need the gateway's runtime and an event loop of its own to run
it. What must outlive this process is in Redis: the response's record (apps.gateway.stored), its
events, which any replica streams to a client, and the cancel flag any replica raises. A run its
process takes down with it reads as failed once no process could still be running it
(ResponseRecord.as_of); uvicorn gives runs the request timeout to finish when it is told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from django.conf import settings

from apps.gateway import sse
from apps.gateway.choices import ResponseStatus
from apps.gateway.dialects.responses import snapshot
from apps.gateway.reply import Reply
from apps.gateway.response_records import ResponseRecord
from apps.gateway.runtime import GatewayRuntime
from apps.gateway.settlement import background_answer, response_record
from apps.gateway.state import CompletionState, reached
from apps.gateway.stored import ResponseStore
from dmxplatform.errors import ApplicationError
from dmxplatform.resp import RedisUnavailable, RespError
from dmxplatform.responses import Headers, dumps

logger = logging.getLogger(__name__)


class BackgroundReply:
    """Where a background run's answer goes: its events to the run's stream in Redis (and to
    the client that asked for them, while it stays), its status to the stored record. Its
    `receive` is the pipeline's client: it "leaves" when the run is cancelled."""

    def __init__(
        self, store: ResponseStore, record: ResponseRecord, client: Reply | None, headers: Headers
    ) -> None:
        self._store = store
        self._record = record
        self._client = client
        self._cancelled = asyncio.Event()
        self.headers = headers
        self.started = False
        self.finished = False

    async def body(self, body: bytes, *, more: bool) -> None:
        self.started = True
        if await self._store.append(self._record, _events(body), end=not more):
            self._cancelled.set()
        self.finished = not more
        await self._to_client(body, more=more)

    async def json(self, status: int, data: bytes) -> None:
        raise RuntimeError("a background run streams its answer")  # forced in detach()

    async def error(self, error: ApplicationError, *, event: bytes = b"") -> None:
        """The run failed: its error events (when it had started) end its stream."""
        await self._store.append(self._record, _events(event), end=True)
        self.finished = True
        if self._client is not None and not self._client.started:
            await self._client.error(error)
        else:
            await self._to_client(event, more=False)

    async def finish(self, kept: ResponseRecord | None, payload: bytes | None) -> None:
        """The run is over: its record as it ended replaces the in-progress copy, and its
        stream ends if nothing ended it. The record is durable already (the settle call's):
        should Redis fail here, readers get it from the database once drained."""
        try:
            if kept is not None:
                await self._store.keep(kept, payload)
            if not self.finished:
                self.finished = True
                await self._store.append(self._record, [], end=True)
        except (RedisUnavailable, RespError) as exc:
            logger.warning("background response %s: its end not in Redis: %r", self._record.id, exc)
        await self._to_client(b"", more=False)

    async def receive(self) -> dict[str, Any]:
        """The pipeline watches its client for leaving: this one leaves when the run is
        cancelled, on any replica (a flag in Redis, polled while no event is written)."""
        poll = settings.DMX_BACKGROUND_CANCEL_POLL_SECONDS
        while not self._cancelled.is_set():
            if await self._store.cancelled(self._record):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cancelled.wait(), poll)
        return {"type": "http.disconnect"}

    async def _to_client(self, body: bytes, *, more: bool) -> None:
        """Tell the client that streams the run what happens, while it stays: its leaving does
        not stop the run."""
        if self._client is None or self._client.finished:
            return
        try:
            await self._client.body(body, more=more)
        except OSError:  # gone: the run goes on
            self._client = None


def _events(body: bytes) -> list[bytes]:
    """A piece of the event stream as its events, one stream entry each: a reader resuming
    after a sequence number counts them (ResponseStore.events)."""
    return [event + sse.SEPARATOR for event in body.split(sse.SEPARATOR) if event]


async def detach(state: CompletionState, runtime: GatewayRuntime) -> BackgroundReply:
    """Answer an admitted background request now (`queued`; a streaming client gets the events
    as they come), mark it in progress, and turn its pipeline's client into the run's Redis
    stream and cancel flag."""
    request = reached(state.request, "parse")
    answer = background_answer(state)
    record = response_record(state, snapshot(answer, ResponseStatus.IN_PROGRESS.value))
    await runtime.responses.keep(record)
    state.detached = True
    streamed = request.stream
    if not streamed:
        await state.reply.json(200, dumps(snapshot(answer, ResponseStatus.QUEUED.value)))
        # The run streams, so that polls see its progress and a client may stream it later.
        request.stream = request.include_usage = True
        request.payload.update(stream=True, stream_options={"include_usage": True})
    client = state.reply if streamed else None
    reply = BackgroundReply(runtime.responses, record, client, state.reply.headers)
    state.reply = reply
    state.receive = reply.receive
    return reply
