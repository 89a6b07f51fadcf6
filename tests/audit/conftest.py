"""The audit log's tests: staff users of each role, a registered node, and how to read the log."""

from __future__ import annotations

import uuid

import pytest
from auditlog.models import LogEntry
from django.db.models import Model

from apps.hardware.models import Node
from apps.hardware.services import node_register, node_token_authenticate
from inference.wire import Registration
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model


@pytest.fixture(autouse=True)
def _own_redis_keys(private_redis):
    """Key records, the fleet and breakers these tests write are their own (tests/conftest.py)."""


def last_entry(obj: Model, action: int = LogEntry.Action.UPDATE) -> LogEntry:
    """The newest entry of `action` about `obj`; fails when there is none."""
    entry = LogEntry.objects.get_for_object(obj).filter(action=action).order_by("-id").first()
    assert entry is not None, f"no entry of action {action} for {obj!r}"
    return entry


@pytest.fixture
def node(django_capture_on_commit_callbacks) -> Node:
    """A node a worker registered, in the database and the live fleet state."""
    make_model("audit-node-model")
    _, plaintext = make_node_token("audit")
    with django_capture_on_commit_callbacks(execute=True):
        node, _ = node_register(
            token=node_token_authenticate(plaintext=plaintext),
            registration=Registration(
                name=f"audit-node-{uuid.uuid4().hex[:6]}",
                url="http://127.0.0.1:1",
                model="audit-node-model",
                version="v1",
                served_model_name="audit-node-model",
                max_model_len=256,
            ),
        )
    return node
