"""The worker's platform client against a real local HTTP server: one kept connection, a
transparent reconnect when the server closed it, and errors with their status."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inference.platform_client import PlatformClient, PlatformError
from inference.wire import EngineLoad, Heartbeat
from tests.stack import free_port


class Platform(ThreadingHTTPServer):
    """Answers heartbeats with 200, node 404 with 404; remembers each request's client port."""

    daemon_threads = True

    def __init__(self, port: int, *, close_after_each: bool) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.close_after_each = close_after_each
        self.seen: list[tuple[int, str, dict]] = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a side closes
    server: Platform

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.client_address[1], self.path, body))
        status, reply = (
            (404, b'{"error": "gone"}')
            if "/404/" in self.path
            else (200, b'{"node_id": 7, "status": "up"}')
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        # An idle timeout on the platform's side: the socket goes without a Connection: close.
        self.close_connection = self.server.close_after_each

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def platform(request) -> Iterator[Platform]:
    server = Platform(free_port(), close_after_each=getattr(request, "param", False))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_for(server: Platform) -> PlatformClient:
    return PlatformClient(f"http://127.0.0.1:{server.server_address[1]}/", "dmx-node-x_y")


HEARTBEAT = Heartbeat(status="up", engine=EngineLoad(num_requests_running=2))


def test_heartbeats_share_one_connection(platform):
    client = client_for(platform)
    for _ in range(5):
        client.heartbeat(7, HEARTBEAT)
    ports = {port for port, _, _ in platform.seen}
    assert len(platform.seen) == 5 and len(ports) == 1
    assert platform.seen[0][1:] == ("/internal/v1/nodes/7/heartbeat", HEARTBEAT.to_dict())


@pytest.mark.parametrize("platform", [True], indirect=True)
def test_a_connection_the_platform_closed_is_reopened_without_an_error(platform):
    client = client_for(platform)
    for _ in range(3):
        client.heartbeat(7, HEARTBEAT)  # each one finds the last connection closed
    assert len(platform.seen) == 3  # every heartbeat arrived, once
    assert len({port for port, _, _ in platform.seen}) == 3


def test_a_refusal_carries_its_status_and_an_unreachable_platform_none(platform):
    client = client_for(platform)
    with pytest.raises(PlatformError) as refused:
        client.heartbeat(404, HEARTBEAT)
    assert refused.value.status == 404 and '"gone"' in str(refused.value)
    client.heartbeat(7, HEARTBEAT)  # the connection survives a refusal

    unreachable = PlatformClient(f"http://127.0.0.1:{free_port()}", "dmx-node-x_y")
    with pytest.raises(PlatformError) as failed:
        unreachable.heartbeat(7, HEARTBEAT)
    assert failed.value.status is None
