"""The fleet dashboard: the last hour of usage per model and minute (real rows, PostgreSQL's
percentile_cont), the page and who may see it, and its WebSocket (refused to anyone but staff
who may view the fleet; a node's heartbeat reaches an open dashboard through the channel layer,
the charts are read again on their own, and a channel layer that fails never fails a
heartbeat)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.billing.selectors import usage_by_intent, usage_minute_series
from apps.console import consumers
from apps.hardware import broadcast
from apps.hardware.models import Node
from apps.hardware.nodestate import TokenRecord, fleet_key, fleet_resources_key
from apps.hardware.services import node_heartbeat_record, node_register, node_token_authenticate
from apps.keys.models import ApiKey
from config.asgi import application
from dmxplatform.redis_client import async_redis, sync_redis
from inference.hardware.detection import get_gpu_info
from inference.wire import EngineLoad, Heartbeat, Registration
from tests.hardware.factories import make_node_token
from tests.inference.hardware.nvml_replay import H100_X8, replay
from tests.keys.factories import make_api_key, make_staff, make_user
from tests.models.factories import make_model

# Redis keys are each test's own (tests/conftest.py); the channel layer's are shared, so
# each test looks only at its own node and model.
pytestmark = pytest.mark.usefixtures("private_redis")

DASHBOARD = "/admin/platform/fleet/"
SOCKET = "/ws/console/fleet"
# What a message the test waits for may take: a heartbeat's push is gathered for half a second.
MESSAGE_TIMEOUT = 5


def _usage(key: ApiKey, model: str, at, *, status="ok", duration_ms=100.0, ttft=None, tokens=0):
    return UsageRecord.objects.create(
        request_id=f"req_{uuid.uuid4().hex}",
        api_key=key,
        tenant=key.tenant,
        created_at=at,
        endpoint="chat.completions",
        model=model,
        status=status,
        http_status=200 if status == "ok" else 502,
        completion_tokens=tokens,
        duration_ms=duration_ms,
        time_to_first_token_ms=ttft,
        stream=ttft is not None,
    )


# --- the usage figures -----------------------------------------------------------------------


@pytest.fixture
def traffic(db):
    """A model's last hour: a full minute two minutes ago (four good streams, one upstream
    error), the running minute 30 s in (three requests), and rows outside the window."""
    model = f"dash-{uuid.uuid4().hex[:8]}"
    key, _ = make_api_key()
    now = timezone.now().replace(second=30, microsecond=0)
    full = now.replace(second=0) - timedelta(minutes=2)
    for i, ms in enumerate((100.0, 200.0, 300.0, 400.0)):
        _usage(key, model, full + timedelta(seconds=i), duration_ms=ms, ttft=ms / 10, tokens=30)
    _usage(key, model, full + timedelta(seconds=50), status="upstream_error", duration_ms=5.0)
    for i in range(3):
        _usage(key, model, now - timedelta(seconds=20 - i), tokens=10)
    _usage(key, model, now - timedelta(minutes=61), tokens=1000)  # before the hour
    _usage(key, model, now + timedelta(seconds=5), tokens=1000)  # after `now`
    return model, now


def test_the_last_hour_per_minute_in_rates_percentiles_and_errors(traffic):
    model, now = traffic
    series = usage_minute_series(now=now)

    assert len(series.minutes) == 60
    assert series.minutes[-1] == now.replace(second=0) and series.minutes[0] == (
        now.replace(second=0) - timedelta(minutes=59)
    )
    figures = series.models[model]
    full, running = -3, -1  # two minutes before the running one
    assert figures.requests[full] == 5 and figures.requests[running] == 3
    assert sum(figures.requests) == 8  # nothing from outside the window
    # A full minute's rates are over 60 s; the running minute's over the 30 s it has run.
    assert figures.requests_per_second[full] == pytest.approx(5 / 60)
    assert figures.tokens_per_second[full] == pytest.approx(120 / 60)
    assert figures.requests_per_second[running] == pytest.approx(3 / 30)
    assert figures.tokens_per_second[running] == pytest.approx(30 / 30)
    assert figures.error_rate[full] == pytest.approx(1 / 5)
    assert figures.error_rate[running] == 0.0
    # Interpolated, over the four good requests only: the error's 5 ms is no latency.
    assert figures.e2e_p95_ms[full] == pytest.approx(385.0)
    assert figures.ttft_p95_ms[full] == pytest.approx(38.5)
    assert figures.ttft_p95_ms[running] is None  # no stream in it: nothing to measure
    assert figures.e2e_p95_ms[running] == pytest.approx(100.0)
    # A quiet minute: no traffic, nothing measured.
    quiet = -2
    assert figures.requests_per_second[quiet] == 0.0 and figures.tokens_per_second[quiet] == 0.0
    assert figures.error_rate[quiet] is None and figures.e2e_p95_ms[quiet] is None


def test_without_percentile_cont_the_figures_are_the_same(traffic, monkeypatch):
    model, now = traffic
    in_sql = usage_minute_series(now=now).models[model]
    monkeypatch.setattr(connection, "vendor", "sqlite")  # the laptop's path, on the same rows
    in_python = usage_minute_series(now=now).models[model]
    assert in_python.e2e_p95_ms == pytest.approx(in_sql.e2e_p95_ms, nan_ok=True)
    assert in_python.ttft_p95_ms[-3] == pytest.approx(38.5)
    assert in_python.requests == in_sql.requests


def test_each_intents_hour_with_its_low_confidence_share_and_percentiles(db, monkeypatch):
    # Intents of the test's own: e2e tests' committed requests may be in the hour too.
    busy, quiet = f"busy-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
    key, _ = make_api_key()
    now = timezone.now()
    for i, ms in enumerate((100.0, 200.0, 300.0, 400.0)):
        record = _usage(key, "m", now - timedelta(minutes=5), duration_ms=ms, ttft=ms / 10)
        UsageRecord.objects.filter(id=record.id).update(intent=busy, intent_low_confidence=i == 0)
    failed = _usage(key, "m", now - timedelta(minutes=5), status="upstream_error", duration_ms=9)
    old = _usage(key, "m", now - timedelta(minutes=61))  # before the hour
    unsure = _usage(key, "m", now - timedelta(minutes=1), duration_ms=50.0)
    UsageRecord.objects.filter(id__in=[failed.id, old.id]).update(intent=busy)
    UsageRecord.objects.filter(id=unsure.id).update(intent=quiet, intent_low_confidence=True)

    for laptop in (False, True):  # percentile_cont, then the laptop's path on the same rows
        if laptop:
            monkeypatch.setattr(connection, "vendor", "sqlite")
        figures = {f.intent: f for f in usage_by_intent(now=now)}
        assert (figures[busy].requests, figures[quiet].requests) == (5, 1)
        assert figures[busy].low_confidence_share == pytest.approx(1 / 5)
        assert figures[quiet].low_confidence_share == 1.0
        # Over the good requests only: the failure's 9 ms is no latency.
        assert figures[busy].e2e_p95_ms == pytest.approx(385.0)
        assert figures[busy].ttft_p95_ms == pytest.approx(38.5)
        assert figures[quiet].ttft_p95_ms is None and figures[quiet].e2e_p95_ms == 50.0
        order = [f.intent for f in usage_by_intent(now=now) if f.intent in (busy, quiet)]
        assert order == [busy, quiet]  # most requests first


# --- the page --------------------------------------------------------------------------------


def _register_node() -> tuple[Node, TokenRecord]:
    """A node with eight H100s, registered and in the live state gateways route on."""
    make_model("dash-model")
    _, plaintext = make_node_token()
    token = node_token_authenticate(plaintext=plaintext)
    registered, _ = node_register(
        token=token,
        registration=Registration(
            name=f"dash-node-{uuid.uuid4().hex[:6]}",
            url="http://127.0.0.1:1",
            model="dash-model",
            version="v1",
            served_model_name="dash-model",
            max_model_len=128,
            resources=get_gpu_info(backend=replay(H100_X8)).to_dict(),
        ),
    )
    return registered, token


@pytest.fixture
def node(db, django_capture_on_commit_callbacks) -> tuple[Node, TokenRecord]:
    with django_capture_on_commit_callbacks(execute=True):  # published to Redis, as in life
        return _register_node()


def _state(html: str) -> dict:
    start = html.index('<script id="fleet-state" type="application/json">')
    body = html[html.index(">", start) + 1 : html.index("</script>", start)]
    return json.loads(body)


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_viewers_and_operators_see_every_node_and_model(client, node, traffic, role):
    registered, _ = node
    model, _ = traffic
    client.force_login(make_staff(role))

    page = client.get(DASHBOARD)

    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-socket-path="/ws/console/fleet"' in html and "console/dashboard.js" in html
    state = _state(html)
    row = next(n for n in state["nodes"] if n["id"] == registered.id)
    assert (row["name"], row["model"], row["version"]) == (registered.name, "dash-model", "v1")
    assert row["gpu_count"] == 8 and row["gpus"] == "8 x NVIDIA H100 80GB HBM3"
    assert row["memory"].endswith(" GiB") and 0 < row["temperature_c"] < 100
    assert row["status"] == "up" and row["heartbeat_at"] <= state["now"]
    assert state["stale_after"] == settings.DMX_NODE_STALE_SECONDS
    assert len(state["minutes"]) == 60 and model in state["models"]
    assert "Fleet dashboard" in client.get("/admin/").content.decode()


def test_an_unreadable_fleet_entry_leaves_the_page_whole(client, node, caplog):
    registered, _ = node
    redis = sync_redis()
    redis.hset(fleet_key(), mapping={str(registered.id): b"{cut short", "99999": b"[]"})
    redis.hset(fleet_resources_key(), str(registered.id), b"{cut short")
    client.force_login(make_staff("viewer"))

    page = client.get(DASHBOARD)

    assert page.status_code == 200
    row = next(n for n in _state(page.content.decode())["nodes"] if n["id"] == registered.id)
    assert row["name"] == registered.name and row["gpus"] == "8 x NVIDIA H100 80GB HBM3"
    assert "unreadable fleet entry" in caplog.text


def test_others_are_sent_to_the_login_or_refused(db, client):
    assert client.get(DASHBOARD).status_code == 302  # anonymous: the admin's login
    client.force_login(make_user())  # a developer, not staff
    response = client.get(DASHBOARD)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    client.force_login(make_staff(None))  # staff without the view permissions
    assert client.get(DASHBOARD).status_code == 403


# --- the WebSocket ---------------------------------------------------------------------------
# Consumers reach the database from their own threads, so these tests commit what they write
# (`committed`) instead of wrapping it in a test transaction.


def _session(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def _socket(session: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if session:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
    return WebsocketCommunicator(application, SOCKET, headers=headers)


@pytest.fixture
def committed_node(committed) -> tuple[Node, TokenRecord]:
    return _register_node()  # published at once: there is no transaction to wait for


async def _next(socket: WebsocketCommunicator, kind: str, found) -> dict:
    """The next message of type `kind` for which found(message) holds (other tests' nodes may
    send theirs through the shared channel layer meanwhile)."""
    deadline = time.monotonic() + MESSAGE_TIMEOUT
    while True:
        message = await socket.receive_json_from(timeout=max(deadline - time.monotonic(), 0.01))
        if message["type"] == kind and found(message):
            return message


def test_the_socket_refuses_anonymous_non_staff_and_staff_without_permissions(committed):
    sessions = [None, _session(make_user()), _session(make_staff(None))]

    async def scenario() -> list[bool]:
        refused = []
        for session in sessions:
            socket = _socket(session)
            connected, _ = await socket.connect()
            refused.append(not connected)
            await socket.disconnect()
        return refused

    assert async_to_sync(scenario)() == [True, True, True]


def test_a_heartbeat_reaches_an_open_dashboard(committed_node):
    registered, token = committed_node
    session = _session(make_staff("viewer"))
    beat = Heartbeat(
        status="up",
        engine=EngineLoad(num_requests_running=3, num_requests_waiting=2, kv_cache_usage=0.42),
        resources=get_gpu_info(backend=replay(H100_X8)).to_dict(),
    )

    async def scenario() -> tuple[dict, dict, float]:
        socket = _socket(session)
        connected, _ = await socket.connect()
        assert connected
        first = await _next(socket, "fleet", lambda m: True)
        redis = async_redis()
        try:
            sent = time.time()
            await node_heartbeat_record(
                redis=redis, token=token, node_id=registered.id, heartbeat=beat
            )
        finally:
            await redis.aclose()
        update = await _next(
            socket, "nodes", lambda m: any(n["id"] == registered.id for n in m["nodes"])
        )
        await socket.disconnect()
        return first, update, sent

    first, update, sent = async_to_sync(scenario)()
    before = next(n for n in first["nodes"] if n["id"] == registered.id)
    assert (before["running"], before["waiting"]) == (0, 0)
    row = next(n for n in update["nodes"] if n["id"] == registered.id)
    assert (row["running"], row["waiting"], row["kv_cache"]) == (3, 2, 0.42)
    assert row["gpu_count"] == 8 and row["heartbeat_at"] >= sent
    assert row["heartbeat_at"] > before["heartbeat_at"]


def test_the_charts_are_read_again_while_the_dashboard_is_open(committed, monkeypatch):
    monkeypatch.setattr(consumers, "REFRESH_SECONDS", 0.2)
    model = f"dash-live-{uuid.uuid4().hex[:8]}"
    key, _ = make_api_key()
    session = _session(make_staff("viewer"))

    async def scenario() -> tuple[dict, dict]:
        socket = _socket(session)
        connected, _ = await socket.connect()
        assert connected
        first = await _next(socket, "fleet", lambda m: True)
        # A request settles while the page is open (as the ledger flush writes it).
        await database_sync_to_async(_usage)(key, model, timezone.now(), tokens=12)
        later = await _next(socket, "fleet", lambda m: model in m["models"])
        await socket.disconnect()
        return first, later

    first, later = async_to_sync(scenario)()
    assert model not in first["models"]
    assert sum(later["models"][model]["requests"]) == 1
    assert later["models"][model]["requests_per_second"][-1] > 0


def test_a_channel_layer_that_hangs_or_fails_never_holds_up_a_heartbeat(node, monkeypatch, caplog):
    registered, token = node
    monkeypatch.setattr(broadcast, "PUSH_TIMEOUT_SECONDS", 0.2)

    class Hanging:
        async def group_send(self, group, message):
            await asyncio.sleep(30)

    class Failing:
        async def group_send(self, group, message):
            raise ConnectionError("channel layer down")

    async def scenario() -> list[float]:
        redis = async_redis()
        took = []
        try:
            for layer in (Hanging(), Failing()):
                monkeypatch.setattr(broadcast, "get_channel_layer", lambda layer=layer: layer)
                start = time.monotonic()
                snapshot = await node_heartbeat_record(
                    redis=redis, token=token, node_id=registered.id, heartbeat=Heartbeat("up")
                )
                took.append(time.monotonic() - start)
                assert snapshot.id == registered.id
                await asyncio.sleep(0.3)  # past the push's timeout
        finally:
            await redis.aclose()
        assert not broadcast._in_flight  # each push ended, by its timeout or its error
        return took

    took = async_to_sync(scenario)()
    assert max(took) < 0.2  # the heartbeat did not wait for the push
    pushes = [r.getMessage() for r in caplog.records if r.name == broadcast.__name__]
    assert len(pushes) == 2 and "TimeoutError" in pushes[0] and "channel layer down" in pushes[1]


def test_the_refresh_carries_on_after_any_error(committed, monkeypatch, caplog):
    monkeypatch.setattr(consumers, "REFRESH_SECONDS", 0.1)
    session = _session(make_staff("viewer"))
    failures = iter([RuntimeError("a bug"), KeyError("another")])
    real = consumers.fleet_state

    def flaky():
        for failure in failures:
            raise failure
        return real()

    monkeypatch.setattr(consumers, "fleet_state", flaky)

    async def scenario() -> dict:
        socket = _socket(session)
        connected, _ = await socket.connect()
        assert connected
        state = await _next(socket, "fleet", lambda m: True)
        await socket.disconnect()
        return state

    assert async_to_sync(scenario)()["type"] == "fleet"
    logged = [r for r in caplog.records if r.getMessage() == "fleet dashboard not refreshed"]
    assert len(logged) == 2 and all(r.exc_info for r in logged)


def test_an_unreadable_node_update_is_dropped_not_fatal(caplog):
    consumer = consumers.FleetDashboardConsumer()
    consumer.pending = {}

    async_to_sync(consumer.node_update)({"type": "node.update", "snapshot": b"{cut short"})

    assert consumer.pending == {} and consumer.pusher is None
    assert "unreadable node update" in caplog.text
