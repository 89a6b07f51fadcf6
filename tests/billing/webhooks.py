"""A tenant's webhook endpoint for tests: a local HTTP server that records the signed alerts it
is sent, and the receiver's check of a signature as docs/use/billing-webhooks.md shows it."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

WAIT_SECONDS = 10


@dataclass
class Received:
    headers: Message  # names as sent, read case-insensitively
    body: bytes

    @property
    def event(self) -> dict:
        return orjson.loads(self.body)


class Receiver:
    """A tenant's webhook endpoint: records what it is sent, answers the statuses it is told
    to (then 200)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.statuses: deque[int] = deque()
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.changed:
                    receiver.received.append(Received(self.headers, body))
                    status = receiver.statuses.popleft() if receiver.statuses else 200
                    receiver.changed.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hooks/dmx"

    def wait_for(self, count: int, timeout: float = WAIT_SECONDS) -> list[Received]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.received) >= count, timeout), (
                f"{len(self.received)} of {count} webhooks arrived"
            )
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verified(secret: str, received: Received, *, tolerance: int = 300) -> bool:
    """A receiver's check, as docs/use/billing-webhooks.md shows it."""
    fields = dict(item.split("=", 1) for item in received.headers["X-DMX-Signature"].split(","))
    timestamp = int(fields["t"])
    signed = f"{timestamp}.".encode() + received.body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return abs(time.time() - timestamp) <= tolerance and hmac.compare_digest(expected, fields["v1"])
