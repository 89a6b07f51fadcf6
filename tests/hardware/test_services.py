import dataclasses

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.hardware.services import node_register, node_token_authenticate, nodes_sync
from dmxplatform.errors import AuthenticationError
from dmxplatform.redis_client import sync_redis
from inference.wire import Registration
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model
from tests.routing.factories import with_engine

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def register(name: str, capture) -> Node:
    make_model("unit-stale")
    _, plaintext = make_node_token()
    registration = Registration(
        name=name,
        url="http://127.0.0.1:1",
        model="unit-stale",
        version="v1",
        served_model_name="unit-stale",
        max_model_len=128,
    )
    with capture(execute=True):
        return node_register(
            token=node_token_authenticate(plaintext=plaintext), registration=registration
        )[0]


def test_silent_nodes_are_marked_down_in_redis_and_the_database(
    settings, django_capture_on_commit_callbacks
):
    silent = register("unit-silent", django_capture_on_commit_callbacks)
    fresh = register("unit-fresh", django_capture_on_commit_callbacks)
    client = sync_redis()
    old = NodeSnapshot.decode(client.hget(fleet_key(), str(silent.id)))
    aged = dataclasses.replace(
        old, heartbeat_at=old.heartbeat_at - settings.DMX_NODE_STALE_SECONDS - 1
    )
    client.hset(fleet_key(), str(silent.id), aged.encode())

    assert nodes_sync() == 1

    silent.refresh_from_db()
    fresh.refresh_from_db()
    assert (silent.status, fresh.status) == (NodeStatus.DOWN, NodeStatus.UP)
    assert NodeSnapshot.decode(client.hget(fleet_key(), str(silent.id))).status == NodeStatus.DOWN
    assert NodeSnapshot.decode(client.hget(fleet_key(), str(fresh.id))).status == NodeStatus.UP
    assert nodes_sync() == 0  # already down: nothing to do


def test_sync_writes_only_the_rows_whose_live_state_moved(django_capture_on_commit_callbacks):
    quiet = register("unit-quiet", django_capture_on_commit_callbacks)
    busy = register("unit-busy", django_capture_on_commit_callbacks)
    client = sync_redis()
    old = NodeSnapshot.decode(client.hget(fleet_key(), str(busy.id)))
    moved = with_engine(old, heartbeat_at=old.heartbeat_at + 1, num_requests_running=5)
    client.hset(fleet_key(), str(busy.id), moved.encode())

    with CaptureQueriesContext(connection) as queries:
        assert nodes_sync() == 0
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1 and f'"id" = {busy.id}' in updates[0]
    busy.refresh_from_db()
    quiet.refresh_from_db()
    assert (busy.num_requests_running, quiet.num_requests_running) == (5, 0)
    with CaptureQueriesContext(connection) as queries:
        nodes_sync()  # nothing moved since
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]


def test_node_tokens_authenticate_from_redis_without_the_database(
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        token, plaintext = make_node_token()
    token_pk = token.pk
    token.delete()  # gone from the database; Redis still vouches for it
    assert node_token_authenticate(plaintext=plaintext).id == token_pk
    with pytest.raises(AuthenticationError):
        node_token_authenticate(plaintext=plaintext[:-1] + ("x" if plaintext[-1] != "x" else "y"))
