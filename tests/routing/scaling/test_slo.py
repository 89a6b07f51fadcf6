"""SLO evaluation: hysteresis, bounds and cooldown, P95 from the usage ledger, queue from Redis.

Scaling goes through the Kubernetes scaler to the stand-in API server (the `kube` fixture).
"""

import random
import statistics
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.billing.choices import UsageStatus
from apps.routing.choices import ScalingAction, ScalingTrigger
from apps.routing.models import ScalingEvent
from apps.routing.scaling.errors import ScalingError
from apps.routing.scaling.selectors import fleet_queue, usage_latency_p95, usage_ttft_p95
from apps.routing.scaling.services import scaling_evaluate
from apps.routing.scaling.slo import MIN_LATENCY_SAMPLES, SLO_WINDOW
from apps.routing.scaling.tasks import slo_evaluate_task
from tests.routing.scaling.factories import (
    NAMESPACE,
    make_policy,
    publish_node,
    record_requests,
    update_node,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

MODEL = "unit-scaled"
# Waiting requests on one node, against the policy's default target of 4 per node: over it,
# inside the band between calm (under a quarter of it) and breach, and idle.
BUSY, HALF_BUSY, IDLE = 10, 2, 0
LATENCY_TARGET_MS = 1000


def evaluate(policy, *, now=None) -> ScalingEvent:
    event = scaling_evaluate(policy_id=policy.id, trigger=ScalingTrigger.SCHEDULE, now=now)
    policy.refresh_from_db()
    return event


def moves(event: ScalingEvent) -> tuple[str, int, int]:
    return event.action, event.from_replicas, event.to_replicas


# --- hysteresis, cooldown, bounds ---


def test_one_breach_holds_two_in_a_row_scale_out(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, breaches_to_scale_out=2, cooldown_seconds=0)
    publish_node(MODEL, waiting=BUSY)

    first = evaluate(policy)

    assert moves(first) == (ScalingAction.HOLD, 1, 1)
    assert kube.replicas(NAMESPACE, MODEL) == 1
    assert first.pk is not None, "a hold while breaching is recorded"
    assert first.figures["queue_per_node"] == BUSY
    assert policy.consecutive_breaches == 1

    second = evaluate(policy)

    assert moves(second) == (ScalingAction.SCALE_OUT, 1, 2)
    assert kube.replicas(NAMESPACE, MODEL) == 2
    assert policy.consecutive_breaches == 0 and policy.last_scaled_at is not None
    assert ScalingEvent.objects.filter(policy=policy).count() == 2


def test_an_evaluation_inside_the_band_breaks_a_breach_streak(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, breaches_to_scale_out=2, cooldown_seconds=0)
    node = publish_node(MODEL, waiting=BUSY)
    evaluate(policy)

    update_node(node, num_requests_waiting=HALF_BUSY)
    steady = evaluate(policy)
    update_node(node, num_requests_waiting=BUSY)
    again = evaluate(policy)

    assert steady.action == ScalingAction.HOLD and steady.pk is None, "not worth an event"
    assert again.action == ScalingAction.HOLD, "the streak started over"
    assert policy.consecutive_breaches == 1
    assert kube.replicas(NAMESPACE, MODEL) == 1


@pytest.mark.parametrize(
    ("waiting", "latency_fraction"),
    [(HALF_BUSY, 0.1), (IDLE, 0.75)],
    ids=["queue-in-band", "latency-in-band"],
)
def test_load_inside_the_band_scales_neither_way(kube, waiting, latency_fraction):
    kube.add(NAMESPACE, MODEL, replicas=2)
    policy = make_policy(
        MODEL,
        latency_target_ms=LATENCY_TARGET_MS,
        breaches_to_scale_out=1,
        calm_to_scale_in=1,
        cooldown_seconds=0,
    )
    publish_node(MODEL, waiting=waiting)
    now = timezone.now()
    durations = [LATENCY_TARGET_MS * latency_fraction] * MIN_LATENCY_SAMPLES
    record_requests(MODEL, durations, at=now - timedelta(minutes=1))

    event = evaluate(policy, now=now)

    assert (event.action, event.figures["verdict"]) == (ScalingAction.HOLD, "steady")
    assert (policy.consecutive_breaches, policy.consecutive_calm) == (0, 0)
    assert kube.replicas(NAMESPACE, MODEL) == 2


def test_calm_scales_in_only_after_calm_to_scale_in_evaluations(kube):
    kube.add(NAMESPACE, MODEL, replicas=3)
    policy = make_policy(MODEL, calm_to_scale_in=3, cooldown_seconds=0)
    publish_node(MODEL, waiting=IDLE)

    holds = [evaluate(policy) for _ in range(2)]

    assert [e.action for e in holds] == [ScalingAction.HOLD] * 2
    assert not ScalingEvent.objects.filter(policy=policy).exists(), "calm holds are not recorded"
    assert kube.replicas(NAMESPACE, MODEL) == 3
    assert policy.consecutive_calm == 2

    assert moves(evaluate(policy)) == (ScalingAction.SCALE_IN, 3, 2)
    assert kube.replicas(NAMESPACE, MODEL) == 2
    assert policy.consecutive_calm == 0, "the next scale-in needs a new calm streak"
    assert evaluate(policy).action == ScalingAction.HOLD


def test_cooldown_holds_a_due_scale_out_until_it_has_passed(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, breaches_to_scale_out=1, cooldown_seconds=120)
    publish_node(MODEL, waiting=BUSY)
    start = timezone.now()

    assert moves(evaluate(policy, now=start)) == (ScalingAction.SCALE_OUT, 1, 2)
    held = evaluate(policy, now=start + timedelta(seconds=60))
    after = evaluate(policy, now=start + timedelta(seconds=121))

    assert moves(held) == (ScalingAction.HOLD, 2, 2)
    assert "cooling down" in held.reason and held.pk is not None
    assert moves(after) == (ScalingAction.SCALE_OUT, 2, 3)
    assert kube.replicas(NAMESPACE, MODEL) == 3


def test_max_replicas_caps_scale_out_and_min_replicas_stops_scale_in(kube):
    kube.add(NAMESPACE, "unit-at-max", replicas=2)
    kube.add(NAMESPACE, "unit-at-min", replicas=1)
    at_max = make_policy("unit-at-max", max_replicas=2, breaches_to_scale_out=1)
    at_min = make_policy("unit-at-min", min_replicas=1, calm_to_scale_in=1)
    publish_node("unit-at-max", waiting=BUSY)
    publish_node("unit-at-min", waiting=IDLE)

    capped = evaluate(at_max)
    floored = evaluate(at_min)

    assert moves(capped) == (ScalingAction.HOLD, 2, 2) and "max_replicas" in capped.reason
    assert moves(floored) == (ScalingAction.HOLD, 1, 1)
    assert (kube.replicas(NAMESPACE, "unit-at-max"), kube.replicas(NAMESPACE, "unit-at-min")) == (
        2,
        1,
    )


def test_a_count_outside_the_bounds_is_brought_back_at_once(kube):
    kube.add(NAMESPACE, "unit-too-few", replicas=0)
    kube.add(NAMESPACE, "unit-too-many", replicas=6)
    too_few = make_policy("unit-too-few", min_replicas=2, breaches_to_scale_out=5)
    too_many = make_policy("unit-too-many", max_replicas=3, calm_to_scale_in=5)
    publish_node("unit-too-many", waiting=BUSY)  # busy, yet over the maximum

    assert moves(evaluate(too_few)) == (ScalingAction.SCALE_OUT, 0, 2)
    assert moves(evaluate(too_many)) == (ScalingAction.SCALE_IN, 6, 3)
    assert kube.replicas(NAMESPACE, "unit-too-few") == 2
    assert kube.replicas(NAMESPACE, "unit-too-many") == 3


def test_a_failed_scale_is_recorded_and_retried_at_the_next_evaluation(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, breaches_to_scale_out=1, cooldown_seconds=600)
    publish_node(MODEL, waiting=BUSY)
    kube.interfere_after_read = True  # the patch meets a newer resourceVersion: 409

    failed = evaluate(policy)

    assert moves(failed) == (ScalingAction.HOLD, 1, 1)
    assert "failed" in failed.reason and failed.figures["error"]
    assert failed.pk is not None
    assert policy.last_scaled_at is None, "no cooldown for a change that did not happen"

    kube.interfere_after_read = False
    assert moves(evaluate(policy)) == (ScalingAction.SCALE_OUT, 1, 2)


def test_a_scaler_that_cannot_read_changes_nothing(kube):
    policy = make_policy(MODEL, breaches_to_scale_out=1)  # no such deployment on the server
    publish_node(MODEL, waiting=BUSY)

    with pytest.raises(ScalingError):
        evaluate(policy)

    assert (policy.consecutive_breaches, ScalingEvent.objects.count()) == (0, 0)


# --- latency from the usage ledger ---


def test_p95_latency_comes_from_the_successful_requests_in_the_window():
    now = timezone.now()
    rng = random.Random(7)
    durations = [rng.uniform(50, 5000) for _ in range(73)]
    record_requests("unit-p95", durations, at=now - timedelta(minutes=2))
    # None of these may count: another model, failed requests, requests before the window.
    record_requests("unit-other", [99_000] * 10, at=now - timedelta(minutes=1))
    record_requests(
        "unit-p95", [99_000] * 10, at=now - timedelta(minutes=1), status=UsageStatus.UPSTREAM_ERROR
    )
    record_requests("unit-p95", [99_000] * 10, at=now - SLO_WINDOW - timedelta(seconds=1))

    p95, samples = usage_latency_p95(model="unit-p95", since=now - SLO_WINDOW, until=now)

    assert samples == len(durations)
    assert p95 == pytest.approx(statistics.quantiles(durations, n=100, method="inclusive")[94])


def test_p95_time_to_first_token_counts_streams_only():
    now = timezone.now()
    rng = random.Random(11)
    ttfts = [rng.uniform(10, 900) for _ in range(41)]
    record_requests("unit-ttft", [1000.0] * 41, at=now, stream=True, ttfts_ms=ttfts)
    record_requests("unit-ttft", [1000.0] * 5, at=now, stream=False, ttfts_ms=[50_000.0] * 5)

    p95, samples = usage_ttft_p95(model="unit-ttft", since=now - SLO_WINDOW, until=now)

    assert samples == len(ttfts)
    assert p95 == pytest.approx(statistics.quantiles(ttfts, n=100, method="inclusive")[94])


def test_slow_requests_breach_the_latency_slo_but_too_few_are_not_judged(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(
        MODEL, latency_target_ms=LATENCY_TARGET_MS, breaches_to_scale_out=1, cooldown_seconds=0
    )
    publish_node(MODEL, waiting=IDLE)  # the queue alone says calm
    now = timezone.now()
    slow = [LATENCY_TARGET_MS * 3.0] * (MIN_LATENCY_SAMPLES - 1)
    record_requests(MODEL, slow, at=now - timedelta(minutes=1))

    unjudged = evaluate(policy, now=now)

    assert unjudged.action == ScalingAction.HOLD
    assert unjudged.figures["verdict"] == "calm", "too few requests: the queue decides"

    record_requests(MODEL, [LATENCY_TARGET_MS * 3.0], at=now - timedelta(minutes=1))
    judged = evaluate(policy, now=now)

    assert moves(judged) == (ScalingAction.SCALE_OUT, 1, 2)
    assert judged.figures["latency_p95_ms"] > LATENCY_TARGET_MS
    assert judged.figures["latency_samples"] == MIN_LATENCY_SAMPLES


def test_a_slow_time_to_first_token_breaches_when_the_model_has_that_target(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(MODEL, ttft_target_ms=200, breaches_to_scale_out=1, cooldown_seconds=0)
    publish_node(MODEL, waiting=IDLE)
    now = timezone.now()
    count = MIN_LATENCY_SAMPLES
    record_requests(MODEL, [300.0] * count, at=now, stream=True, ttfts_ms=[250.0] * count)

    event = evaluate(policy, now=now)

    assert event.action == ScalingAction.SCALE_OUT
    assert "time to first token" in event.reason


def test_requests_before_the_last_change_are_not_judged_again(kube):
    kube.add(NAMESPACE, MODEL, replicas=1)
    policy = make_policy(
        MODEL, latency_target_ms=LATENCY_TARGET_MS, breaches_to_scale_out=1, cooldown_seconds=0
    )
    publish_node(MODEL, waiting=HALF_BUSY)
    now = timezone.now()
    slow = [LATENCY_TARGET_MS * 3.0] * (MIN_LATENCY_SAMPLES * 2)
    record_requests(MODEL, slow, at=now - timedelta(minutes=1))
    assert evaluate(policy, now=now).action == ScalingAction.SCALE_OUT

    later = evaluate(policy, now=now + timedelta(minutes=1))  # the slow ones are in 5 minutes

    assert later.action == ScalingAction.HOLD
    assert later.figures["latency_samples"] == 0
    assert kube.replicas(NAMESPACE, MODEL) == 2


# --- queue depth from the fleet hash ---


def test_queue_depth_counts_live_nodes_of_the_model_only(settings):
    publish_node("unit-queue", waiting=3)
    publish_node("unit-queue", waiting=5)
    publish_node("unit-queue", waiting=50, age_seconds=settings.DMX_NODE_STALE_SECONDS + 1)
    publish_node("unit-queue", waiting=50, status="down")
    publish_node("unit-queue", waiting=50, status="draining")
    publish_node("unit-other", waiting=50)

    assert fleet_queue(model="unit-queue") == (2, 8)


def test_no_live_node_is_no_reason_to_scale_in(kube):
    kube.add(NAMESPACE, MODEL, replicas=2)
    policy = make_policy(MODEL, calm_to_scale_in=1, cooldown_seconds=0)

    event = evaluate(policy)

    assert event.action == ScalingAction.HOLD
    assert event.figures["live_nodes"] == 0
    assert kube.replicas(NAMESPACE, MODEL) == 2


# --- the beat's task ---


def test_the_beat_task_evaluates_every_active_policy(kube, eager_celery):
    for name in ("unit-a", "unit-b", "unit-off"):
        kube.add(NAMESPACE, name, replicas=1)
        publish_node(name, waiting=BUSY)
    active = [make_policy(n, breaches_to_scale_out=1) for n in ("unit-a", "unit-b")]
    make_policy("unit-off", breaches_to_scale_out=1, is_active=False)

    assert slo_evaluate_task() == len(active)

    assert kube.replicas(NAMESPACE, "unit-a") == kube.replicas(NAMESPACE, "unit-b") == 2
    assert kube.replicas(NAMESPACE, "unit-off") == 1
    assert set(ScalingEvent.objects.values_list("trigger", flat=True)) == {"schedule"}
