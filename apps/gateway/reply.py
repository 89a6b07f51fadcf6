"""The answer to the client of one request, over ASGI: JSON once, or an event stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from dmxplatform.errors import ApplicationError
from dmxplatform.responses import EVENT_STREAM, Headers, send_error, send_json


class ClientLeft(Exception):
    """The client closed the connection before its answer was complete."""


class Reply(Protocol):
    """Where a request's answer goes: its client (ClientReply), or a background run's stream
    (apps.gateway.background)."""

    headers: Headers
    started: bool
    finished: bool

    async def json(self, status: int, data: bytes) -> None: ...

    async def error(self, error: ApplicationError, *, event: bytes = b"") -> None: ...

    async def body(self, body: bytes, *, more: bool) -> None: ...


class ClientReply:
    """What the stages gathered for the response's head (request id, rate-limit headers), and
    whether the head went out: a stream's status line cannot be taken back, so an error after
    it goes in the stream, as OpenAI sends one. `finished`: the response's last byte went out."""

    __slots__ = ("_error_body", "_send", "finished", "headers", "started")

    def __init__(
        self, send: Any, headers: Headers, error_body: Callable[[ApplicationError], bytes]
    ) -> None:
        """`error_body`: an error in the shape of the API the client speaks."""
        self._send = send
        self.headers = headers
        self._error_body = error_body
        self.started = False
        self.finished = False

    async def json(self, status: int, data: bytes) -> None:
        await send_json(self._send, status, data, self.headers)
        self.finished = True

    async def error(self, error: ApplicationError, *, event: bytes = b"") -> None:
        """Answer with the error; once the stream has started, with `event` (the error as the
        stream's writer puts it) instead."""
        if self.started:
            await self.body(event, more=False)
        else:
            await send_error(self._send, error, self.headers, body=self._error_body(error))
            self.finished = True

    async def body(self, body: bytes, *, more: bool) -> None:
        """Send a piece of the event stream, its head first."""
        if not self.started:
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", EVENT_STREAM),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),  # proxies must not hold events back
                        *self.headers,
                    ],
                }
            )
            self.started = True
        await self._send({"type": "http.response.body", "body": body, "more_body": more})
        self.finished = not more
