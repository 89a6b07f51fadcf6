"""Fault injection for e2e tests, and the ledger check every fault test ends with.

TcpProxy: the platform's processes reach PostgreSQL through it, so a test can take the database
away from them (every open connection reset, new ones refused) without stopping the server the
test process itself, and every other test, still uses. OwnRedis: a redis-server a test starts,
kills and restarts itself. assert_recorded_once: each request the test sent is in the ledger
once, with the tokens its client got.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.http import call

# Bytes per read: a PostgreSQL message rarely exceeds this, and bigger ones just take two.
CHUNK = 65536


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def cut(self) -> None:
        """Reset every connection and refuse new ones, as a dead server would."""
        self._open.clear()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._drop(sock)

    def restore(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()


@dataclass
class Sent:
    """One request as its client saw it: what the ledger must hold for it, exactly once."""

    request_id: str
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0


def send_chat(api_url: str, key: str, body: dict[str, Any], *, timeout: float = 60) -> Sent:
    """Send a chat completion; return what the client got (tokens from its usage, 0 when it
    failed, which is what a failure must be billed)."""
    reply = call("POST", api_url + "/chat/completions", key=key, json_body=body, timeout=timeout)
    sent = Sent(request_id=reply.headers.get("x-request-id", ""), status=reply.status)
    if reply.status == 200:
        usage = reply.json()["usage"]
        sent.prompt_tokens = usage["prompt_tokens"]
        sent.completion_tokens = usage["completion_tokens"]
    return sent


def assert_recorded_once(sent: list[Sent], *, key, timeout: float = 30) -> None:
    """Every request the clients sent is in the ledger once, with the tokens they were given,
    and the key's daily totals count each once."""
    from django.db import connection

    from apps.keys.models import UsageDaily, UsageRecord
    from tests.stack import wait_for

    assert all(s.request_id for s in sent), "every answer carries its request id"
    ids = [s.request_id for s in sent]
    assert len(set(ids)) == len(ids)

    def arrived() -> bool:
        connection.close()  # a fresh snapshot each time
        return UsageRecord.objects.filter(request_id__in=ids).count() == len(ids)

    wait_for(arrived, timeout=timeout, interval=0.5, what=f"{len(ids)} usage records")
    rows = {r.request_id: r for r in UsageRecord.objects.filter(request_id__in=ids)}
    for s in sent:
        row = rows[s.request_id]
        assert (row.http_status, row.prompt_tokens, row.completion_tokens) == (
            s.status,
            s.prompt_tokens,
            s.completion_tokens,
        ), (s, row.status, row.error_code)
    days = UsageDaily.objects.filter(api_key=key)
    assert sum(d.requests for d in days) == len(sent)
    assert sum(d.prompt_tokens + d.completion_tokens for d in days) == sum(
        s.prompt_tokens + s.completion_tokens for s in sent
    )


class OwnRedis:
    """A redis-server of the test's own, append-only as production must run the one holding
    the streams; kill() is SIGKILL, start() again reloads its append-only file."""

    def __init__(self, directory: Path, *, appendonly: bool = True) -> None:
        self.appendonly = appendonly
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", "everysec",
                "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log"),
            ],
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on {self.port} did not start")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def send_chat_stream(api_url: str, key: str, body: dict[str, Any], *, timeout: float = 120):
    """Stream a chat completion with usage; return what the client got and its time to the
    first content chunk, seconds (None when none came)."""
    import json
    import urllib.error
    import urllib.request

    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(
        api_url + "/chat/completions",
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    started = time.monotonic()
    first: float | None = None
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        return Sent(request_id=error.headers.get("x-request-id", ""), status=error.code), None
    with response:
        sent = Sent(request_id=response.headers["x-request-id"], status=response.status)
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: ") :])
            if "error" in chunk:
                sent.status = 0  # failed after it started: what it was billed is not known here
                continue
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.monotonic() - started
            if chunk.get("usage"):
                sent.prompt_tokens = chunk["usage"]["prompt_tokens"]
                sent.completion_tokens = chunk["usage"]["completion_tokens"]
    return sent, first
