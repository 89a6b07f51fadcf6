"""Operators' actions on the platform through the API: canaries (start with a ramp and gates,
promote, roll back), a node's breaker reset, nightly weights approved or rejected. Staff only."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from apps.hardware.models import Node
from apps.models.models import ModelVersion
from apps.models.services import model_version_create
from apps.routing.breaker import breakers_key, probe_key
from apps.routing.choices import CanaryAction, RecomputationStatus
from apps.routing.models import CanaryEvent, RoutingRule, WeightRecomputation
from dmxplatform.redis_client import sync_redis
from tests.api.conftest import API, error_of
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def version() -> ModelVersion:
    model, _ = make_model(f"api-canary-{uuid.uuid4().hex[:6]}", sla_latency_p95_ms=700)
    return model_version_create(model=model, tag="v2")


def start(operator, version, **body):
    return operator.client.post(
        f"{API}/canaries", {"version": version.id, "percent": "5", **body}, format="json"
    )


def test_a_canary_starts_with_its_ramp_and_gates(operator, version):
    response = start(
        operator,
        version,
        steps=[25, 50, 100],
        gates={"min_requests": 30, "error_tolerance": 0.02, "latency_p95_ms": None},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["id"], body["percent"], body["steps"], body["step"]) == (
        version.id,
        "5.00",
        [5.0, 25.0, 50.0, 100.0],
        0,
    )
    assert body["gates"] == {"min_requests": 30, "error_tolerance": 0.02, "latency_p95_ms": 700}
    listed = operator.client.get(f"{API}/canaries").json()["results"]
    assert [row["id"] for row in listed] == [version.id]
    again = start(operator, version)
    assert again.status_code == 400 and error_of(again)["param"] == "version"


def test_a_ramp_that_does_not_climb_is_a_400(operator, version):
    response = start(operator, version, steps=[50, 25])
    assert response.status_code == 400 and error_of(response)["param"] == "steps"
    assert not ModelVersion.objects.get(id=version.id).is_canary


def test_promote_and_roll_back(operator, version):
    assert start(operator, version).status_code == 201
    rolled = operator.client.post(f"{API}/canaries/{version.id}/rollback")
    assert rolled.status_code == 200 and rolled.json()["action"] == CanaryAction.ROLLBACK
    # No longer a canary: nothing to promote.
    assert operator.client.post(f"{API}/canaries/{version.id}/promote").status_code == 404
    assert start(operator, version).status_code == 201
    promoted = operator.client.post(f"{API}/canaries/{version.id}/promote")
    assert promoted.status_code == 200 and not promoted.json()["automatic"]
    version.refresh_from_db()
    assert version.is_stable
    assert CanaryEvent.objects.filter(version=version, operator=operator.user).count() == 4


def test_a_breaker_reset(operator, version):
    node = Node.objects.create(
        name="api-breaker-node",
        url="http://127.0.0.1:1",
        model_version=version,
        served_model_name=version.model.name,
        max_model_len=128,
        token=make_node_token()[0],
        registered_at=timezone.now(),
        last_heartbeat_at=timezone.now(),
    )
    client = sync_redis()
    client.hset(breakers_key(), str(node.id), "open 5 1000")  # as gateways store it
    client.set(probe_key(node.id), "1")
    response = operator.client.post(f"{API}/nodes/{node.id}/breaker/reset")
    assert response.status_code == 204
    assert client.hget(breakers_key(), str(node.id)) is None
    assert not client.exists(probe_key(node.id))
    assert operator.client.post(f"{API}/nodes/{10**9}/breaker/reset").status_code == 404


def proposal(rule: RoutingRule) -> WeightRecomputation:
    moment = timezone.now()
    return WeightRecomputation.objects.create(
        window_start=moment,
        window_end=moment,
        status=RecomputationStatus.PROPOSED,
        changes=[{"rule": rule.id, "old": rule.weight, "new": 3.5}],
    )


def test_weights_approved_or_rejected_once(operator, version):
    rule = RoutingRule.objects.create(alias="api-weights", model=version.model)
    applied, rejected = proposal(rule), proposal(rule)
    listed = operator.client.get(f"{API}/weight-recomputations", {"status": "proposed"})
    assert {row["id"] for row in listed.json()["results"]} == {applied.id, rejected.id}
    response = operator.client.post(f"{API}/weight-recomputations/{applied.id}/apply")
    assert response.status_code == 200 and response.json()["status"] == "applied"
    assert response.json()["decided_by"] == operator.user.username
    rule.refresh_from_db()
    assert rule.weight == 3.5
    response = operator.client.post(f"{API}/weight-recomputations/{rejected.id}/reject")
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    twice = operator.client.post(f"{API}/weight-recomputations/{applied.id}/reject")
    assert twice.status_code == 400
    assert WeightRecomputation.objects.get(id=applied.id).status == "applied"


@pytest.mark.parametrize(
    "path", ["canaries", "canaries/1/promote", "nodes/1/breaker/reset", "weight-recomputations"]
)
def test_non_operators_find_nothing(owner, path):
    for response in (
        owner.client.get(f"{API}/{path}"),
        owner.client.post(f"{API}/{path}", {}, format="json"),
    ):
        assert response.status_code == 404 and error_of(response)["code"] == "not_found"
