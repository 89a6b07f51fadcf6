"""The one reader of the fleet's live state: an entry that does not decode (a hand edit, a value
cut short) is logged and left out, never fatal to the readers (the dashboard, the node admin,
/metrics, the models list); a field a newer release added is ignored."""

from __future__ import annotations

import logging

import orjson
import pytest

from apps.hardware.models import Node
from apps.hardware.nodestate import fleet_key, fleet_resources_key
from apps.hardware.selectors import fleet_read, fleet_snapshots, models_available, node_states
from apps.hardware.services import node_register, node_token_authenticate
from dmxplatform.redis_client import sync_redis
from inference.wire import Registration
from tests.hardware.factories import make_node_token
from tests.hardware.test_resources import h100_view
from tests.models.factories import make_model
from tests.routing.factories import make_snapshot

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")

# Entries no release writes: not JSON, JSON of another shape, a required field missing.
UNREADABLE = {
    "901": b"{not json",
    "902": b"[1, 2]",
    "903": orjson.dumps(
        {k: v for k, v in orjson.loads(make_snapshot().encode()).items() if k != "url"}
    ),
    "904": b"null",
}


def test_an_unreadable_entry_is_logged_and_left_out(caplog):
    good = make_snapshot(id=900)
    sync_redis().hset(fleet_key(), mapping={"900": good.encode(), **UNREADABLE})

    with caplog.at_level(logging.WARNING, logger="apps.hardware.selectors"):
        assert fleet_snapshots() == {900: good}

    warnings = [r.getMessage() for r in caplog.records if "unreadable fleet entry" in r.message]
    assert len(warnings) == len(UNREADABLE)
    assert any("{not json" in w for w in warnings)


def test_fields_a_newer_release_added_are_ignored():
    """In a rolling update newer gateways take heartbeats while older ones still route: an older
    gateway that refused their snapshots would see no node at all."""
    node = make_snapshot(id=905, num_requests_running=3)
    newer = orjson.loads(node.encode())
    newer["engine"]["speculative_acceptance"] = 0.7
    newer["rack"] = "r12"
    sync_redis().hset(fleet_key(), mapping={"905": orjson.dumps(newer)})

    assert fleet_snapshots() == {905: node}


def test_the_resources_are_read_with_the_fleet_and_guarded_the_same(caplog):
    good = make_snapshot(id=910)
    view = h100_view()  # once: it carries the host's memory as read now
    redis = sync_redis()
    redis.hset(fleet_key(), mapping={"910": good.encode(), "901": b"{not json"})
    redis.hset(
        fleet_resources_key(),
        mapping={"910": orjson.dumps(view), "911": b"{cut", "912": b"7", "x": b"{}"},
    )

    with caplog.at_level(logging.WARNING, logger="apps.hardware.selectors"):
        fleet = fleet_read()

    assert fleet.snapshots == {910: good}
    assert fleet.resources == {910: view}
    assert sum("unreadable fleet resources" in r.message for r in caplog.records) == 3


@pytest.mark.django_db
def test_node_states_show_a_node_whose_entry_is_unreadable_from_its_row(
    django_capture_on_commit_callbacks,
):
    make_model("sel-model")
    _, plaintext = make_node_token()
    with django_capture_on_commit_callbacks(execute=True):
        node, _ = node_register(
            token=node_token_authenticate(plaintext=plaintext),
            registration=Registration(
                name="sel-node",
                url="http://127.0.0.1:1",
                model="sel-model",
                version="v1",
                served_model_name="sel-model",
                max_model_len=128,
                resources=h100_view(),
            ),
        )
    redis = sync_redis()
    redis.hset(fleet_key(), mapping={str(node.id): b"{cut short", **UNREADABLE})
    redis.hset(fleet_resources_key(), str(node.id), b"{cut short")

    # Only this test's node: the e2e stack's rows are committed and visible here too.
    states = [state for state in node_states() if state.snapshot.name.startswith("sel-")]

    assert [state.snapshot.name for state in states] == ["sel-node"]
    assert states[0].snapshot.id == node.id
    assert states[0].hardware.gpus == "8 x NVIDIA H100 80GB HBM3"  # the row's view
    assert Node.objects.filter(id=node.id).exists()


@pytest.mark.django_db
def test_models_available_skip_an_unreadable_entry():
    make_model("sel-served")
    served = make_snapshot(id=920, model="sel-served")
    sync_redis().hset(fleet_key(), mapping={"920": served.encode(), **UNREADABLE})

    available = {model.name: model.served for model in models_available()}

    assert available["sel-served"] is True
