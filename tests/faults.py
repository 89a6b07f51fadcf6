"""Fault injection for e2e tests, and the ledger check every fault test ends with.

TcpProxy: the platform's processes reach PostgreSQL through it, so a test can take the database
away from them (every open connection reset, new ones refused) without stopping the server the
test process itself, and every other test, still uses. OwnRedis and OwnRedisCluster: a
redis-server, or a cluster of them, a test starts, kills and restarts itself.
assert_recorded_once: each request the test sent is in the ledger
once, with the tokens its client got.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.client import NEVER_DECODE
from redis.crc import key_slot

from tests.http import call
from tests.stack import free_port, wait_for

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
            for source, sink, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(source, sink, answers), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        """Copy one direction (`answers`: the server's) until either side closes."""
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


class StreamCutter(TcpProxy):
    """The network path to a node whose event streams end early: each streamed answer is cut
    after `events` SSE events (vLLM's first is its role chunk), with a reset (`reset=True`: what
    a client sees of an engine killed by SIGKILL) or a plain close (an engine ending the stream
    without `[DONE]`). Everything else passes as it is."""

    def __init__(self, target: tuple[str, int], *, events: int, reset: bool) -> None:
        self.events = events
        self.reset = reset
        # When set, every POST gets this HTTP response instead of the engine's (a failing
        # engine's 5xx: fail_with()).
        self.answer: bytes | None = None
        # Per stream cut: the completion tokens the last event it let through reported (vLLM's
        # continuous usage), i.e. what the node generated that its client could be given.
        self.cut_usage: list[int] = []
        self._resetting: set[socket.socket] = set()
        super().__init__(target)

    def _drop(self, sock: socket.socket) -> None:
        if sock not in self._resetting:
            super()._drop(sock)
            return
        with self._lock:
            self._sockets.discard(sock)
        sock.close()  # no shutdown: it would send a FIN before the reset

    def fail_with(self, status: int, error: dict[str, Any]) -> None:
        """Answer every POST with `status` and vLLM's error body for `error`, as an engine
        that cannot serve (its engine core dead, out of memory) does."""
        body = json.dumps({"error": {**error, "param": None, "code": status}}).encode()
        self.answer = (
            b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(body), body)
        )

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        if not answers:
            if self.answer is not None:
                self._answer(source, sink)
            else:
                super()._pump(source, sink, answers)
            return
        head = b""  # the current response's head, until it is complete
        streaming, seen, body = False, 0, b""
        try:
            while data := source.recv(CHUNK):
                if not streaming:
                    head += data
                    if b"\r\n\r\n" not in head:
                        sink.sendall(data)
                        continue
                    streaming = b"text/event-stream" in head.split(b"\r\n\r\n", 1)[0]
                    head = b""
                    if not streaming:
                        sink.sendall(data)
                        continue
                # An event ends in a blank line; the chunked framing adds CRLFs, never one.
                cut = _after_events(data, self.events - seen)
                if cut is None:
                    seen += data.count(b"\n\n")
                    body += data
                    sink.sendall(data)
                    if data.endswith(b"\r\n0\r\n\r\n"):  # its end: the next response's head
                        streaming, seen, body = False, 0, b""
                    continue
                sink.sendall(data[:cut])
                usage = re.findall(rb'"completion_tokens":(\d+)', body + data[:cut])
                self.cut_usage.append(int(usage[-1]) if usage else 0)
                if self.reset:  # SO_LINGER 0: closing sends RST, as a killed process's kernel
                    sink.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self._resetting.add(sink)
                    # Wakes the other direction's recv on it without a FIN; only once no call
                    # holds the socket does the kernel release it, with the RST.
                    sink.shutdown(socket.SHUT_RD)
                break
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                self._drop(sock)

    def _answer(self, client: socket.socket, upstream: socket.socket) -> None:
        """Give POSTs self.answer and pass the rest (a health check) to the engine."""
        try:
            while data := client.recv(CHUNK):
                if data.startswith(b"POST ") and self.answer is not None:
                    client.sendall(self.answer)
                    break
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                self._drop(sock)


def _after_events(data: bytes, wanted: int) -> int | None:
    """Where the `wanted`-th event ending in `data` ends, or None if fewer end in it."""
    at = 0
    for _ in range(wanted):
        found = data.find(b"\n\n", at)
        if found < 0:
            return None
        at = found + 2
    return at


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

    from apps.billing.models import UsageDaily, UsageRecord

    assert all(s.request_id for s in sent), "every answer carries its request id"
    ids = [s.request_id for s in sent]
    assert len(set(ids)) == len(ids)

    def arrived() -> bool:
        connection.close()  # a fresh snapshot each time
        return UsageRecord.objects.filter(request_id__in=ids).count() == len(ids)

    try:
        wait_for(arrived, timeout=timeout, interval=0.5, what=f"{len(ids)} usage records")
    except TimeoutError:
        # How many are missing tells a stalled drain (most of them) from lost records (a few).
        connection.close()
        found = set(
            UsageRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True)
        )
        missing = [s for s in sent if s.request_id not in found]
        raise AssertionError(
            f"{len(missing)} of {len(ids)} usage records missing after {timeout:.0f} s; "
            f"the first: {missing[:5]}"
        ) from None
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


def _redis_server(port: int, directory: Path, *options: str) -> subprocess.Popen:
    """Start a redis-server on a loopback port, with its files in `directory`; return once it
    listens."""
    directory.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendfsync", "everysec", "--dir", str(directory),
            "--logfile", str(directory / "redis.log"), *options,
        ],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return process
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(f"redis-server on {port} did not start")
        time.sleep(0.05)


def _kill(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


class OwnRedis:
    """A redis-server of the test's own, append-only as production must run the one holding
    the streams; kill() is SIGKILL, start() again reloads its append-only file."""

    def __init__(
        self, directory: Path, *, appendonly: bool = True, options: tuple[str, ...] = ()
    ) -> None:
        self.appendonly = appendonly
        self.options = options  # more redis-server flags
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        appendonly = "yes" if self.appendonly else "no"
        self.process = _redis_server(
            self.port, self.directory, "--appendonly", appendonly, *self.options
        )
        return self

    def kill(self) -> None:
        _kill(self.process)


class OwnRedisCluster:
    """A Redis Cluster of the test's own: `masters` append-only redis-servers in cluster mode,
    no replicas, on loopback ports. kill(i) is SIGKILL of master i; restart(i) brings it back
    on its port with its node table and append-only file, as a restarted pod would.

    cluster-require-full-coverage is off, as production should run it: a master that is down
    fails its own slots' commands, not every master's."""

    def __init__(self, directory: Path, *, masters: int = 3) -> None:
        self.directory = directory
        self.ports = [free_port() for _ in range(masters)]
        # The cluster bus's ports, given: the default (port + 10000) may be taken or too high.
        self.bus_ports = [free_port() for _ in range(masters)]
        self.processes: list[subprocess.Popen | None] = [None] * masters

    @property
    def url(self) -> str:
        """The seed URL DMX_REQUEST_REDIS_URL takes: every master."""
        return "redis://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self) -> OwnRedisCluster:
        for index in range(len(self.ports)):
            self._spawn(index)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # What redis-cli said, so that a failure says why (it failed once in a whole-suite run
        # with its output swallowed).
        assert created.returncode == 0, (
            f"redis-cli --cluster create failed ({created.returncode}): "
            f"{created.stdout[-2000:]} {created.stderr[-2000:]}"
        )
        for index in range(len(self.ports)):
            self._wait_serving(index)
        return self

    def kill(self, index: int) -> None:
        _kill(self.processes[index])

    def pause(self, index: int) -> None:
        """SIGSTOP master i: it accepts connections (the kernel does) and answers nothing, as a
        master behind a network that drops packets."""
        os.kill(self.processes[index].pid, signal.SIGSTOP)

    def resume(self, index: int) -> None:
        os.kill(self.processes[index].pid, signal.SIGCONT)

    def restart(self, index: int) -> None:
        self._spawn(index)
        self._wait_serving(index)

    def stop(self) -> None:
        for process in self.processes:
            _kill(process)

    def node_of(self, key: str) -> int:
        """The index of the master that holds `key`'s slot."""
        slot = key_slot(key.encode())
        for start, end, (_, port, *_), *_ in self._cli(0, "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return self.ports.index(port)
        raise AssertionError(f"no master serves slot {slot}")

    def _spawn(self, index: int) -> None:
        port = self.ports[index]
        self.processes[index] = _redis_server(
            port, self.directory / str(port),
            "--appendonly", "yes", "--cluster-enabled", "yes",
            "--cluster-port", str(self.bus_ports[index]), "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000",
            "--cluster-require-full-coverage", "no",
        )  # fmt: skip

    def _wait_serving(self, index: int, *, timeout: float = 30) -> None:
        """Until the master has loaded its data and counts itself part of a healthy cluster
        (before that it answers LOADING or CLUSTERDOWN)."""
        wait_for(
            lambda: b"cluster_state:ok" in self._info(index),
            timeout=timeout,
            interval=0.1,
            what=f"cluster node {self.ports[index]} to serve",
        )

    def _info(self, index: int) -> bytes:
        with contextlib.suppress(redis.RedisError):
            return self._cli(index, "CLUSTER", "INFO")
        return b""

    def _cli(self, index: int, *command: str):
        client = redis.Redis(port=self.ports[index], socket_timeout=5)
        try:
            return client.execute_command(*command, **{NEVER_DECODE: True})
        finally:
            client.close()


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
