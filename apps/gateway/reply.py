"""The answer to the client of one request, over ASGI: JSON once, or an event stream."""

from __future__ import annotations

from typing import Any

from apps.gateway import sse
from dmxplatform.errors import ApplicationError
from dmxplatform.responses import EVENT_STREAM, Headers, send_error, send_json


class ClientReply:
    """What the stages gathered for the response's head (request id, rate-limit headers), and
    whether the head went out: a stream's status line cannot be taken back, so an error after
    it goes in the stream, as OpenAI sends one."""

    __slots__ = ("_send", "headers", "started")

    def __init__(self, send: Any, headers: Headers) -> None:
        self._send = send
        self.headers = headers
        self.started = False

    async def json(self, status: int, data: bytes) -> None:
        await send_json(self._send, status, data, self.headers)

    async def error(self, error: ApplicationError) -> None:
        if self.started:
            await self.body(sse.encode(error.to_json()), more=False)
        else:
            await send_error(self._send, error, self.headers)

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
