"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol, except that an idle
connection is closed only when no request is waiting in it.

uvicorn closes a keep-alive connection when its idle timer fires, without looking at the socket.
After a stall of the process (a busy machine's scheduler, a long GC, a stop) the timer and the
client's next request are due at once; asyncio and uvloop both ran the timer first, closed the
socket with the request unread in it, and the kernel answered that with a reset: the client saw
`ReadError` before any response, and the gateway logged nothing (issue 38). Here the timer looks
first: with bytes waiting (or the client's FIN) the connection stays, and the read that is due
answers the request or closes it as the client asked. The same holds at shutdown: a request that
already arrived on an idle connection is answered, with `Connection: close`, not reset.
"""

from __future__ import annotations

import logging
import select

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dmxplatform import metrics

logger = logging.getLogger(__name__)

_IDLE_CLOSED = metrics.gateway_connections_closed.labels("idle")


def request_waiting(transport) -> bool:
    """Whether the client sent bytes the server has not read yet (or closed its side)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    # poll, not select: select cannot watch a descriptor above 1023, which a busy gateway has.
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's protocol whose idle timeout and shutdown never close a connection with a
    request already in it."""

    _stopping = False

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.is_closing():
            return
        if request_waiting(self.transport):
            metrics.gateway_keepalive_requests_waiting.inc()
            logger.info(
                "keep-alive of %s expired with a request waiting in it: kept to answer it",
                self.client,
            )
            self._arm_keep_alive()
            return
        _IDLE_CLOSED.inc()
        self.transport.close()

    def shutdown(self) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing() and request_waiting(self.transport):
            # Answered, and the connection closed after it (on_headers_complete).
            self._stopping = True
            self._arm_keep_alive()
            return
        super().shutdown()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False

    def _arm_keep_alive(self) -> None:
        """Look again after another idle period: the read that is due cancels this (uvicorn's
        data_received and connection_lost do), so it fires only if nothing was read."""
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
