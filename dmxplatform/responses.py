"""Plain ASGI reading and writing, for the endpoints served outside Django (config.asgi)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import orjson
from django.conf import settings

from dmxplatform.errors import (
    ApplicationError,
    MethodNotAllowedError,
    RequestTimeoutError,
    RequestTooLargeError,
)

JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"

Headers = list[tuple[bytes, bytes]]


def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """Return a request header's value (names are lower-case in ASGI)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def read_body(receive: Any, limit: int) -> bytes:
    """Read the whole request body, refusing more than `limit` bytes or taking longer than
    DMX_BODY_READ_TIMEOUT_SECONDS (a client that declares a body and sends part of it would
    otherwise hold its connection and its memory for as long as it likes)."""
    timeout = settings.DMX_BODY_READ_TIMEOUT_SECONDS
    try:
        async with asyncio.timeout(timeout):
            return await _read_body(receive, limit)
    except TimeoutError:
        raise _late(timeout) from None


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    if not await receive_body(receive, limit, chunks.append):
        return b""
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def receive_body(receive: Any, limit: int, write: Callable[[bytes], object]) -> bool:
    """Hand the request body to `write` chunk by chunk as it arrives (read_body keeps it in
    memory, an upload spools it to disk), refusing more than `limit` bytes with a 413 sent
    after the rest was read (_refuse_oversized). False: the client left before its end."""
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise await _refuse_oversized(receive, message, size, limit)
        write(chunk)
        if not message.get("more_body"):
            return True


async def receive_upload(
    receive: Any, limit: int, write: Callable[[bytes], object], *, within: float
) -> bool:
    """receive_body for an upload of up to hundreds of megabytes, which may take minutes: a
    408 when no bytes come for DMX_BODY_READ_TIMEOUT_SECONDS (nginx's client_body_timeout),
    or when the whole body has not come `within` seconds (a client dripping a byte at a time
    would otherwise hold its connection, a task and a temporary file for as long as it
    likes)."""
    idle, total = settings.DMX_BODY_READ_TIMEOUT_SECONDS, within

    async def next_message() -> dict[str, Any]:
        try:
            async with asyncio.timeout(idle):
                return await receive()
        except TimeoutError:
            raise _body_timeout(
                f"No part of the request body arrived for {idle:g} seconds."
            ) from None

    try:
        async with asyncio.timeout(total):
            return await receive_body(next_message, limit, write)
    except TimeoutError:
        raise _late(total) from None


def _late(seconds: float) -> RequestTimeoutError:
    return _body_timeout(f"The request body did not arrive within {seconds:g} seconds.")


def _body_timeout(message: str) -> RequestTimeoutError:
    return RequestTimeoutError(message, headers={"Connection": "close"})


async def _refuse_oversized(
    receive: Any, message: dict[str, Any], size: int, limit: int
) -> RequestTooLargeError:
    """Read and drop the rest of an oversized body before the 413 goes out. A client like
    urllib or requests sends its whole body before it reads a reply; if the server closes
    with bytes still unread, the kernel answers them with a reset, and the client sees a
    broken connection instead of the 413 (nginx's lingering close and Go's net/http do the
    same). What is dropped is bounded by another `limit` bytes and by the read timeout; a
    client sending more than that gets its connection closed."""
    while message.get("more_body") and size <= 2 * limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        size += len(message.get("body", b""))
    return RequestTooLargeError(
        f"Request body is larger than {limit} bytes.",
        headers={"Connection": "close"} if message.get("more_body") else None,
    )


def query_params(scope: dict[str, Any]) -> dict[str, str]:
    """The query string's parameters, the last value of each. Bytes that are no UTF-8 cannot
    be a valid value: replaced, they fail its check."""
    text = scope["query_string"].decode(errors="replace")
    return {name: values[-1] for name, values in parse_qs(text).items()}


async def wait_disconnect(receive: Any) -> None:
    """Return when the client has gone (ASGI's http.disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def send_json(send: Any, status: int, body: bytes, headers: Headers) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", JSON),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Any, error: ApplicationError, headers: Headers, *, body: bytes | None = None
) -> None:
    """Answer with the error: OpenAI's shape, or `body` (another API's)."""
    extra = [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
    await send_json(send, error.status, body or error.to_json(), [*headers, *extra])


def method_not_allowed(allowed: str) -> MethodNotAllowedError:
    return MethodNotAllowedError(f"Method not allowed; use {allowed}.", headers={"Allow": allowed})


async def send_method_not_allowed(send: Any, allowed: str, headers: Headers) -> None:
    await send_error(send, method_not_allowed(allowed), headers)


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)
