"""Requests asked for from inside the platform: the very pipeline /v1 runs (limits, content
filter, routing, billing), for the portal's playground (chat completions for a key whose user is
signed in, without the key's secret, which the platform never keeps), for responses over a
WebSocket (authenticated by the socket's handshake) and for a batch's lines (apps.batches).

The request goes through the pipeline (apps.gateway.pipeline) over an in-process ASGI
exchange, so nothing here can drift from what /v1 does; the caller reads the response as events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from apps.gateway.pipeline import complete
from apps.gateway.runtime import get_runtime
from apps.gateway.schemas import Endpoint
from apps.gateway.state import CompletionState
from apps.keys.gate import KeyRecord
from dmxplatform.clients import client_address


@dataclass
class Reply:
    """What the pipeline answered: the status and request id, then the stream's events (a chat
    completion's chunks, a response's events) or, when it failed, the error body."""

    status: int = 0
    request_id: str = ""
    error: dict[str, Any] | None = None
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)


_END = object()


def _sse_chunks(buffer: bytearray) -> list[dict[str, Any]]:
    """Take the complete `data:` events off the front of an SSE buffer."""
    chunks = []
    while (end := buffer.find(b"\n\n")) >= 0:
        event = bytes(buffer[:end])
        del buffer[: end + 2]
        for line in event.split(b"\n"):
            if line.startswith(b"data: ") and line[6:] != b"[DONE]":
                chunks.append(orjson.loads(line[6:]))
    return chunks


async def chat_stream(
    *, key: KeyRecord, body: dict[str, Any], caller: dict[str, Any]
) -> AsyncIterator[tuple[Reply, dict[str, Any] | None]]:
    """Run a streamed chat completion for `key`; yield (reply, chunk) for every chunk, first
    (reply, None) once the status is known. Leaving the iteration early is a client that left:
    the pipeline stops the generation and bills what was generated. `caller`: the ASGI scope
    of the caller's own connection (the portal's WebSocket), whose client the key's allowed
    networks are checked against."""
    body = {**body, "stream_options": {"include_usage": True}}
    async for event in stream(Endpoint.CHAT, body, caller=caller, key=key):
        yield event


@dataclass
class Answer:
    """An unstreamed request's answer: its status and body (the API's object, or its error)."""

    status: int = 0
    retry_after: float = 0.0
    body: bytearray = field(default_factory=bytearray)


async def call(
    endpoint: Endpoint,
    body: dict[str, Any],
    *,
    key: KeyRecord,
    caller: dict[str, Any],
    batch_id: str,
    request_id: str,
) -> Answer:
    """Run an unstreamed request to `endpoint` for `key` through the pipeline: a batch's line
    (apps.batches), billed at the batch price and routed at the batch tier, under the request
    id its batch gave the try."""
    scope = await _scope(endpoint, caller, ())
    payload = orjson.dumps(body)
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.Future()  # the caller never leaves; cancelling the call stops it
        raise AssertionError  # unreachable

    answer = Answer()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            headers = dict(message.get("headers", []))
            with contextlib.suppress(ValueError):
                answer.retry_after = float(headers.get(b"retry-after", b"0"))
        else:
            answer.body.extend(message.get("body", b""))

    state = CompletionState(
        endpoint, scope, receive, send, key=key, batch_id=batch_id, request_id=request_id
    )
    await complete(state)
    return answer


async def _scope(
    endpoint: Endpoint, caller: dict[str, Any], headers: Iterable[tuple[bytes, bytes]]
) -> dict[str, Any]:
    """The ASGI scope of an in-process POST to `endpoint`, from the caller's client."""
    runtime = await get_runtime()
    peer = caller.get("client")
    client = (client_address(caller, runtime.trusted_proxies), peer[1]) if peer else None
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": endpoint.path,
        "raw_path": endpoint.path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": client,
        "server": None,
    }


async def stream(
    endpoint: Endpoint,
    body: dict[str, Any],
    *,
    caller: dict[str, Any],
    key: KeyRecord | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> AsyncIterator[tuple[Reply, dict[str, Any] | None]]:
    """Run a streamed request to `endpoint` through the pipeline; yield (reply, event) for
    every event's data, first (reply, None) once the status is known. The request acts for
    `key` (a signed-in user's), or is authenticated by `headers` as /v1 would (the caller's
    own Authorization header: a WebSocket's handshake)."""
    scope = await _scope(endpoint, caller, headers)
    payload = orjson.dumps({**body, "stream": True})
    left = asyncio.Event()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    reply = Reply()
    started = asyncio.Event()
    buffer = bytearray()
    error_body = bytearray()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.request_id = dict(message.get("headers", [])).get(b"x-request-id", b"").decode()
            started.set()
            return
        chunk = message.get("body", b"")
        if reply.status == 200:
            buffer.extend(chunk)
            for parsed in _sse_chunks(buffer):
                await reply.chunks.put(parsed)
        else:
            error_body.extend(chunk)
        if not message.get("more_body", False):
            await reply.chunks.put(_END)

    task = asyncio.ensure_future(complete(CompletionState(endpoint, scope, receive, send, key=key)))
    try:
        waiting = asyncio.ensure_future(started.wait())
        await asyncio.wait([waiting, task], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not started.is_set():  # the pipeline answers every request; this is a bug
            task.result()
            raise RuntimeError("the pipeline ended without a response")
        if reply.status != 200:
            await task
            reply.error = orjson.loads(bytes(error_body) or b"{}").get("error")
            yield reply, None
            return
        yield reply, None
        while (chunk := await reply.chunks.get()) is not _END:
            yield reply, chunk
    finally:
        left.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
