"""A pooled HTTP/1.1 client for the hop to vLLM nodes: keep-alive connections, httptools parsing.

aiohttp spends about 200 microseconds of CPU per request here, most of it in machinery this hop
does not need (cookies, redirects, compression, proxies, tracing hooks). The gateway only POSTs
JSON to nodes it trusts and reads a JSON body or a stream of SSE chunks back, so this client
writes the request as one buffer, parses the answer with httptools in an asyncio protocol, and
keeps idle connections per node for the next request.

Timeouts: connecting must finish within `connect_timeout`; after that, any gap longer than
`read_timeout` between bytes from the node fails the response (a long generation that keeps
streaming is fine). A stream the consumer falls behind on pauses reading from the node, so a
slow client does not make the gateway buffer a whole generation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from urllib.parse import urlsplit

import httptools

# Bytes a response may buffer before reading from the node pauses, and where it resumes.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class UpstreamConnectionError(ConnectionError):
    """The node could not be reached, closed the connection, or went silent too long."""


class UpstreamTimeout(UpstreamConnectionError):
    """A non-streamed request's answer did not come within the time it had: the request's
    timeout, not the node's failure (vLLM answers such a request only once it is generated)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    def __init__(self, pool: HttpPool, origin: tuple[str, int]) -> None:
        self.pool = pool
        self.origin = origin
        # Set by connection_made, which asyncio calls before the connection is handed over.
        self.transport: asyncio.Transport
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._arm()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"bad response from the node: {exc}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._disarm()
        self._fail(UpstreamConnectionError(f"the node closed the connection: {exc}"))

    # httptools callbacks --------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        response = self.response
        if response is not None and not response.started.done():
            response.status = self.parser.get_status_code()
            response.started.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.push(body)

    def on_message_complete(self) -> None:
        self._disarm()
        response = self.response
        if response is not None:
            response.keep_alive = self.parser.should_keep_alive()
            response.finish()

    # ------------------------------------------------------------------------------------------

    def send(self, response: UpstreamResponse, request: bytes, first_byte: float | None) -> None:
        self.response = response
        if self.transport.is_closing():
            # The node closed it between connecting and now (uvloop reads the close before the
            # connecting coroutine resumes); its transport would refuse the write outright.
            response.fail(UpstreamConnectionError("the node closed the connection at once"))
            return
        self.transport.write(request)
        self._arm(first_byte)

    def _arm(self, first_byte: float | None = None) -> None:
        """Restart the read timer: the node must send something within read_timeout, or its
        first byte within `first_byte`."""
        self._disarm()
        if first_byte is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.pool.read_timeout, self._expire
            )
        else:
            self._timer = asyncio.get_running_loop().call_later(first_byte, self._expire_first)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._fail(UpstreamConnectionError("the node sent nothing within the read timeout"))
        self.transport.close()

    def _expire_first(self) -> None:
        self._fail(UpstreamTimeout("the answer did not come within the request's time"))
        self.transport.close()

    def _fail(self, error: Exception) -> None:
        response = self.response
        if response is not None and not response.complete:
            response.fail(error)


class UpstreamResponse:
    """A node's answer: status once the headers are in, then the body, whole or in chunks."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.started: asyncio.Future = asyncio.get_running_loop().create_future()
        self.status = 0
        self.keep_alive = False
        self.complete = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future | None = None

    # Fed by the connection.

    def push(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.transport.pause_reading()
        self._wake()

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: Exception) -> None:
        self._error = error
        if not self.started.done():
            self.started.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # Read by the gateway.

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """Body chunks as they arrive (what has arrived is handed over in one piece)."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._chunks.clear()
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._connection.transport.resume_reading()
                yield data
                continue
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None

    def unread(self, data: bytes) -> None:
        """Put back what was read: chunks() yields it again first."""
        if data:
            self._chunks.appendleft(data)
            self._buffered += len(data)
            self._wake()

    async def read(self) -> bytes:
        """The whole body."""
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with it: the connection goes back to the pool when it can carry another request,
        and is closed otherwise (which also tells vLLM to stop generating)."""
        connection = self._connection
        connection.response = None
        if self.complete and self.keep_alive and not connection.closed:
            connection.pool.give_back(connection)
        else:
            connection.transport.close()

    def close(self) -> None:
        """Abandon the response: close the connection, which makes vLLM stop generating."""
        self._connection.response = None
        self._connection.transport.close()


async def _started(response: UpstreamResponse) -> UpstreamResponse:
    """Wait for the response's headers; called off (cancelled), close the connection, which
    tells the node to drop the request rather than leave it generating for no one."""
    try:
        await response.started
    except asyncio.CancelledError:
        response.close()
        raise
    return response


class HttpPool:
    def __init__(self, *, connect_timeout: float, read_timeout: float, max_idle_per_node: int):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._max_idle = max_idle_per_node
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._heads: dict[tuple[str, int], bytes] = {}

    def give_back(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.transport.close()

    async def _connect(self, origin: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, origin), *origin),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectionError(
                f"cannot connect to {origin[0]}:{origin[1]}: {exc}"
            ) from exc
        return connection

    def _head(self, origin: tuple[str, int]) -> bytes:
        head = self._heads.get(origin)
        if head is None:
            head = self._heads[origin] = (
                f"Host: {origin[0]}:{origin[1]}\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\n"
            ).encode()
        return head

    async def post(
        self, url: str, body: bytes, *, first_byte: float | None = None, headers: bytes = b""
    ) -> UpstreamResponse:
        """POST JSON and wait for the response's status line and headers; within `first_byte`
        seconds when given (a non-streamed request, answered whole), else within the read
        timeout. `headers`: the request's own header lines, each ending in CRLF."""
        parts = urlsplit(url)
        origin = (parts.hostname or "", parts.port or 80)
        request = b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
            parts.path.encode(),
            self._head(origin),
            headers,
            len(body),
            body,
        )
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            response = UpstreamResponse(connection)
            connection.send(response, request, first_byte)
            try:
                return await _started(response)
            except UpstreamConnectionError:
                # The node closed this idle connection before our request reached it (its
                # keep-alive timeout): nothing was processed, so a fresh connection is safe.
                continue
        connection = await self._connect(origin)
        response = UpstreamResponse(connection)
        connection.send(response, request, first_byte)
        return await _started(response)

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.transport.close()
        self._idle.clear()
