"""An operator's drain: kept in the Node row, carried by the live snapshot gateways route on,
and kept there through heartbeats, re-registration, a Redis that lost the node, and a
heartbeat that raced the drain's publish. (That a drained node gets no new request is the
router's: tests/routing/test_router.py.)"""

from __future__ import annotations

import dataclasses
import re

import orjson
import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from redis.exceptions import RedisError

from apps.hardware import admin as hardware_admin
from apps.hardware.models import Node
from apps.hardware.nodestate import NodeSnapshot, TokenRecord, fleet_key
from apps.hardware.selectors import fleet_snapshots
from apps.hardware.services import (
    node_drain,
    node_heartbeat_record,
    node_register,
    node_snapshot,
    node_token_authenticate,
    node_undrain,
    nodes_sync,
)
from dmxplatform.redis_client import async_redis, sync_redis
from inference.wire import EngineLoad, Heartbeat, HeartbeatAccepted, Registration
from tests.hardware.factories import make_node_token
from tests.hardware.test_node_api import call_heartbeat
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


@pytest.fixture
def publish(django_capture_on_commit_callbacks):
    """Run what services publish after commit, as a real commit would."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def token(publish) -> TokenRecord:
    with publish():
        _, plaintext = make_node_token()
    return node_token_authenticate(plaintext=plaintext)


def register(token: TokenRecord, publish) -> Node:
    make_model("drain-model")
    registration = Registration(
        name="drain-node",
        url="http://127.0.0.1:1",
        model="drain-model",
        version="v1",
        served_model_name="drain-model",
        max_model_len=128,
    )
    with publish():
        return node_register(token=token, registration=registration)[0]


@pytest.fixture
def node(token, publish) -> Node:
    return register(token, publish)


def live(node: Node) -> NodeSnapshot:
    return NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))


def heartbeat(node: Node, token: TokenRecord, *, running: int = 0) -> NodeSnapshot:
    """A worker's heartbeat, as the gateway's endpoint stores it."""
    beat = Heartbeat(status="up", engine=EngineLoad(num_requests_running=running))

    async def send() -> NodeSnapshot:
        redis = async_redis()
        try:
            return await node_heartbeat_record(
                redis=redis, token=token, node_id=node.id, heartbeat=beat
            )
        finally:
            await redis.aclose()

    return async_to_sync(send)()


def test_a_drain_reaches_the_live_state_and_keeps_its_load(node, token, publish):
    heartbeat(node, token, running=3)
    with publish():
        node_drain(node=node)
    node.refresh_from_db()
    snapshot = live(node)
    assert node.drained and snapshot.drained
    # Onto the live snapshot: the load the heartbeat reported is not set back to the row's.
    assert snapshot.engine.num_requests_running == 3 and node.num_requests_running == 0
    assert not snapshot.is_live(now=snapshot.heartbeat_at, stale_after=60)


def test_the_drain_survives_heartbeats(node, token, publish):
    with publish():
        node_drain(node=node)
    after = heartbeat(node, token, running=2)
    assert after.drained and after.engine.num_requests_running == 2
    assert live(node).drained


def test_the_drain_survives_re_registration(node, token, publish):
    with publish():
        node_drain(node=node)
    again = register(token, publish)
    assert again.id == node.id and again.drained
    assert live(node).drained


def test_the_drain_survives_a_redis_that_lost_the_node(node, token, publish):
    with publish():
        node_drain(node=node)
    sync_redis().hdel(fleet_key(), str(node.id))
    # What the next heartbeat rebuilds the lost snapshot from.
    assert node_snapshot(Node.objects.get(id=node.id)).drained


def test_sync_puts_back_a_drain_a_racing_heartbeat_undid(node, token, publish):
    with publish():
        node_drain(node=node)
    # A heartbeat that read the snapshot before the drain's publish and stored it after.
    undone = dataclasses.replace(live(node), drained=False)
    sync_redis().hset(fleet_key(), str(node.id), undone.encode())
    assert nodes_sync() == 0
    assert live(node).drained
    node.refresh_from_db()
    assert node.drained  # the sync never copies the flag from Redis into the row


def test_undrain_lets_requests_back(node, token, publish):
    with publish():
        node_drain(node=node)
        node_undrain(node=node)
    node.refresh_from_db()
    assert not node.drained and not live(node).drained
    assert not heartbeat(node, token).drained
    nodes_sync()
    assert not live(node).drained


def test_operators_drain_and_undrain_from_the_admin(token, publish, admin_client):
    node = register(token, publish)
    with publish():
        response = admin_client.post(
            "/admin/hardware/node/", {"action": "drain", "_selected_action": [node.id]}
        )
    assert response.status_code == 302
    live = NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))
    assert Node.objects.get(id=node.id).drained and live.drained
    listed = admin_client.get("/admin/hardware/node/?drained__exact=1").content.decode()
    assert node.name in listed
    with publish():
        admin_client.post(
            "/admin/hardware/node/", {"action": "undrain", "_selected_action": [node.id]}
        )
    live = NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))
    assert not Node.objects.get(id=node.id).drained and not live.drained


def test_the_heartbeat_answer_tells_the_worker_and_the_admin_shows_in_flight(publish, admin_client):
    with publish():
        _, plaintext = make_node_token()
    node = register(node_token_authenticate(plaintext=plaintext), publish)
    beat = Heartbeat(status="up", engine=EngineLoad(num_requests_running=2, num_requests_waiting=1))
    status, _, body = call_heartbeat(node.id, orjson.dumps(beat.to_dict()), token=plaintext)
    assert status == 200 and not HeartbeatAccepted.from_dict(body).drained
    with publish():
        node_drain(node=node)
    status, _, body = call_heartbeat(node.id, orjson.dumps(beat.to_dict()), token=plaintext)
    assert status == 200 and HeartbeatAccepted.from_dict(body).drained
    listed = admin_client.get("/admin/hardware/node/").content.decode()
    assert "3 (2 running, 1 waiting)" in listed  # the heartbeat's, not the row's zeros


def test_the_admin_reads_in_flight_only_for_the_list_and_keeps_it_on_the_request(
    node, admin_client, monkeypatch
):
    reads = []

    def counted():
        reads.append(1)
        return fleet_snapshots()

    monkeypatch.setattr(hardware_admin, "fleet_snapshots", counted)
    model_admin = admin.site._registry[Node]
    before = set(vars(model_admin))

    assert admin_client.get(f"/admin/hardware/node/{node.id}/change/").status_code == 200
    assert admin_client.get(f"/admin/hardware/node/{node.id}/delete/").status_code in (200, 403)
    assert reads == []
    listed = admin_client.get("/admin/hardware/node/")
    assert listed.status_code == 200 and "0 (0 running, 0 waiting)" in listed.content.decode()
    assert reads == [1]  # once for the page, not once a row
    assert set(vars(model_admin)) == before  # nothing of one request's on the shared admin


def test_the_admin_list_without_redis_says_so_in_the_in_flight_column(
    node, admin_client, monkeypatch, caplog
):
    def unreachable():
        raise RedisError("connection refused")

    monkeypatch.setattr(hardware_admin, "fleet_snapshots", unreachable)

    listed = admin_client.get("/admin/hardware/node/")

    assert listed.status_code == 200
    html = listed.content.decode()
    assert node.name in html
    assert re.search(r'<td class="field-in_flight">-</td>', html)
    assert "node list without live in-flight figures" in caplog.text


def test_the_admin_list_with_an_unreadable_entry_shows_the_row(node, admin_client):
    sync_redis().hset(fleet_key(), str(node.id), b"{cut short")

    listed = admin_client.get("/admin/hardware/node/")

    assert listed.status_code == 200 and "0 (0 running, 0 waiting)" in listed.content.decode()
