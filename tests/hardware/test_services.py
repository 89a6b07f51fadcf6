from datetime import timedelta

import pytest
from django.utils import timezone

from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.hardware.services import node_register, nodes_mark_stale
from inference.wire import Registration
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


def register(name: str) -> Node:
    make_model("unit-stale")
    token, _ = make_node_token()
    registration = Registration(
        name=name,
        url="http://127.0.0.1:1",
        model="unit-stale",
        version="v1",
        served_model_name="unit-stale",
        max_model_len=128,
    )
    return node_register(token=token, registration=registration)[0]


def test_silent_nodes_are_marked_down_and_fresh_ones_left_alone(settings):
    settings.DMX_REDIS_PREFIX = "dmxtest-unit-stale"
    silent, fresh = register("unit-silent"), register("unit-fresh")
    Node.objects.filter(id=silent.id).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=settings.DMX_NODE_STALE_SECONDS + 1)
    )
    assert nodes_mark_stale() >= 1
    silent.refresh_from_db()
    fresh.refresh_from_db()
    assert silent.status == NodeStatus.DOWN
    assert fresh.status == NodeStatus.UP
