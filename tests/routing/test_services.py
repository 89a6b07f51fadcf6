"""Canary judgement, nightly weights and the decision log, on real PostgreSQL and Redis."""

import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.models.models import ModelVersion
from apps.models.services import model_version_create
from apps.routing.choices import CanaryAction, RecomputationStatus
from apps.routing.decisions import DECISION_STREAM, DecisionEvent
from apps.routing.models import RoutingDecision, RoutingRule
from apps.routing.services import (
    canary_evaluate,
    canary_start,
    decisions_flush,
    weights_apply,
    weights_recompute,
)
from dmxplatform import streams
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_api_key
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def record(
    key,
    *,
    model: str,
    version: str,
    status="ok",
    duration_ms=100.0,
    intent="",
    node="",
    when=None,
    tokens=(10, 10),
) -> UsageRecord:
    return UsageRecord.objects.create(
        request_id=f"req_{uuid.uuid4().hex}",
        api_key=key,
        tenant=key.tenant,
        created_at=when or timezone.now(),
        endpoint="chat.completions",
        model=model,
        model_version=version,
        node=node or f"node-{version}",
        intent=intent,
        status=status,
        http_status=200 if status == "ok" else 502,
        prompt_tokens=tokens[0],
        completion_tokens=tokens[1],
        duration_ms=duration_ms,
    )


@pytest.fixture
def canary(settings):
    settings.DMX_CANARY_MIN_REQUESTS = 20
    model, stable = make_model(f"canary-{uuid.uuid4().hex[:6]}")
    model.sla_latency_p95_ms = 500
    model.save()
    version = canary_start(version=model_version_create(model=model, tag="v2"), percent=10)
    version.canary_started_at = timezone.now() - timedelta(minutes=5)
    version.save()
    key, _ = make_api_key()
    return model, stable, version, key


def test_nothing_before_enough_requests(canary):
    model, _, version, key = canary
    for _ in range(5):
        record(key, model=model.name, version="v2")
    assert canary_evaluate(version_id=version.id) is None


def test_a_fast_reliable_canary_is_promoted(canary):
    model, stable, version, key = canary
    for _ in range(30):
        record(key, model=model.name, version="v2", duration_ms=200)
        record(key, model=model.name, version="v1", duration_ms=300)
    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.PROMOTE and event.automatic
    assert event.figures["canary"]["requests"] == 30
    assert event.figures["canary"]["latency_p95_ms"] == 200
    version.refresh_from_db()
    stable.refresh_from_db()
    assert version.is_stable and float(version.canary_percent) == 0
    assert not stable.is_stable


def test_a_canary_over_its_latency_target_is_rolled_back(canary):
    model, stable, version, key = canary
    for _ in range(30):
        record(key, model=model.name, version="v2", duration_ms=900)
    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.ROLLBACK
    assert event.figures["latency_target_ms"] == 500
    version.refresh_from_db()
    assert not version.is_stable and float(version.canary_percent) == 0
    assert ModelVersion.objects.get(id=stable.id).is_stable


def test_a_canary_failing_more_than_stable_is_rolled_back(canary):
    model, _, version, key = canary
    for i in range(30):
        record(key, model=model.name, version="v2", status="upstream_error" if i % 5 == 0 else "ok")
        record(key, model=model.name, version="v1")
    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.ROLLBACK
    assert event.figures["canary"]["error_rate"] == pytest.approx(6 / 30, abs=1e-4)
    assert event.figures["stable"]["error_rate"] == 0


def test_nightly_weights_move_toward_the_better_route(settings):
    settings.DMX_ROUTING_WEIGHTS_AUTO_APPLY = False
    fast, _ = make_model(f"fast-{uuid.uuid4().hex[:6]}")
    slow, _ = make_model(f"slow-{uuid.uuid4().hex[:6]}")
    alias = f"auto{uuid.uuid4().hex[:6]}"
    a = RoutingRule.objects.create(alias=alias, intent="code", model=fast, weight=1.0)
    b = RoutingRule.objects.create(alias=alias, intent="code", model=slow, weight=1.0)
    key, _ = make_api_key()
    for _ in range(60):
        record(key, model=fast.name, version="v1", duration_ms=100, intent="code")
        record(key, model=slow.name, version="v1", duration_ms=400, intent="code")
    recomputation = weights_recompute()
    assert recomputation.status == RecomputationStatus.PROPOSED
    changes = {c["rule"]: c for c in recomputation.changes}
    # Equal success and cost; speed 1 vs 100/400: targets 2 x (1, 0.25) / 1.25 = 1.6 and 0.4,
    # halfway from 1.0: 1.3 and 0.7. The group's total weight is kept.
    assert changes[a.id]["new"] == pytest.approx(1.3)
    assert changes[b.id]["new"] == pytest.approx(0.7)
    a.refresh_from_db()
    assert a.weight == 1.0  # proposed only
    weights_apply(recomputation=recomputation)
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.weight, b.weight) == pytest.approx((1.3, 0.7))


def test_rules_with_too_little_evidence_keep_their_weight():
    model, _ = make_model(f"quiet-{uuid.uuid4().hex[:6]}")
    rule = RoutingRule.objects.create(alias=f"a{uuid.uuid4().hex[:6]}", model=model, weight=2.5)
    changes = {c["rule"]: c for c in weights_recompute().changes}
    assert changes[rule.id]["new"] == 2.5


def test_decisions_flush_into_the_log_once():
    event = DecisionEvent(
        request_id=f"req_{uuid.uuid4().hex}",
        created_at=time.time(),
        requested_model="auto",
        model="m",
        intent="code",
        priority=1,
        outcome="routed",
        chosen_node="n1",
        chosen_version="v1",
        pool="stable",
        fallback=False,
        candidates=[{"node": "n1", "version": "v1", "rejected_by": None, "scores": {}, "total": 1}],
        waited_ms=0.0,
        decision_us=12.5,
    )
    client = sync_redis()
    for _ in range(2):  # redelivered: stored once
        client.xadd(DECISION_STREAM.shard(0).key(), {streams.FIELD: event.encode()})
    assert decisions_flush() == 2
    row = RoutingDecision.objects.get(request_id=event.request_id)
    assert row.candidates["nodes"][0]["node"] == "n1" and row.decision_us == 12.5
