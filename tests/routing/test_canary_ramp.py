"""A canary's ramp: each step is judged on its own requests against its gates, advances to the
next share, promotes after the last, rolls back on a failed gate; started from the admin's form.
On real PostgreSQL, with usage records as the gateway writes them."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.models.models import ModelVersion
from apps.models.services import CanaryGates, model_version_create
from apps.routing.choices import CanaryAction
from apps.routing.models import CanaryEvent
from apps.routing.services import (
    canary_evaluate,
    canary_promote,
    canary_rollback,
    canary_start,
)
from tests.keys.factories import make_api_key, make_staff
from tests.models.factories import make_model
from tests.routing.test_services import record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

GATES = CanaryGates(min_requests=10, error_tolerance=0.05, latency_p95_ms=500)


@pytest.fixture
def model():
    model, _ = make_model(f"ramp-{uuid.uuid4().hex[:6]}", sla_latency_p95_ms=800)
    return model


@pytest.fixture
def key():
    return make_api_key()[0]


def started(model, **kwargs) -> ModelVersion:
    version = canary_start(version=model_version_create(model=model, tag="v2"), **kwargs)
    # The step began a while ago, so that records written now fall inside its window.
    earlier = timezone.now() - timedelta(minutes=5)
    ModelVersion.objects.filter(id=version.id).update(
        canary_started_at=earlier, canary_step_started_at=earlier
    )
    return ModelVersion.objects.get(id=version.id)


def serve(key, model, count: int, *, duration_ms: float = 200.0, errors: int = 0) -> None:
    for i in range(count):
        record(
            key,
            model=model.name,
            version="v2",
            duration_ms=duration_ms,
            status="upstream_error" if i < errors else "ok",
        )
        record(key, model=model.name, version="v1", duration_ms=duration_ms)


def next_step_window(version: ModelVersion) -> None:
    """Move the new step's start back too: each step counts only its own requests."""
    ModelVersion.objects.filter(id=version.id).update(
        canary_step_started_at=timezone.now() - timedelta(minutes=1)
    )


def test_the_ramp_advances_step_by_step_and_promotes_after_the_last(model, key):
    version = started(model, percent=5, steps=[25, 50, 100], gates=GATES)
    assert version.canary_steps == [5.0, 25.0, 50.0, 100.0]
    assert float(version.canary_percent) == 5 and version.canary_step == 0
    assert CanaryEvent.objects.get(version=version).action == CanaryAction.START

    serve(key, model, 9)
    assert canary_evaluate(version_id=version.id) is None  # below the gate's 10 requests

    serve(key, model, 1)
    for step, percent in ((1, 25), (2, 50), (3, 100)):
        event = canary_evaluate(version_id=version.id)
        assert event.action == CanaryAction.STEP and event.automatic
        assert event.figures["step"] == step - 1
        version.refresh_from_db()
        assert (version.canary_step, float(version.canary_percent)) == (step, percent)
        assert version.is_canary
        # The new step has no requests of its own yet: its window starts now.
        assert canary_evaluate(version_id=version.id) is None
        next_step_window(version)
        serve(key, model, 10)

    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.PROMOTE
    version.refresh_from_db()
    assert version.is_stable and float(version.canary_percent) == 0
    assert not ModelVersion.objects.get(model=model, tag="v1").is_stable
    actions = (
        CanaryEvent.objects.filter(version=version).order_by("id").values_list("action", flat=True)
    )
    assert list(actions) == ["start", "step", "step", "step", "promote"]


def test_a_step_over_its_latency_bound_rolls_back(model, key):
    version = started(model, percent=5, steps=[50, 100], gates=GATES)
    serve(key, model, 10)
    assert canary_evaluate(version_id=version.id).action == CanaryAction.STEP
    next_step_window(version)
    serve(key, model, 10, duration_ms=900)
    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.ROLLBACK and event.automatic
    assert event.figures["step"] == 1 and event.figures["latency_target_ms"] == 500
    version.refresh_from_db()
    assert not version.is_canary and not version.is_stable
    assert ModelVersion.objects.get(model=model, tag="v1").is_stable


def test_a_step_over_its_error_gate_rolls_back(model, key):
    version = started(model, percent=10, steps=[100], gates=GATES)
    serve(key, model, 10, errors=1)  # 10%: more than the stable versions' 0% plus 5 points
    event = canary_evaluate(version_id=version.id)
    assert event.action == CanaryAction.ROLLBACK
    assert event.figures["canary"]["error_rate"] == pytest.approx(0.1)
    assert event.figures["error_tolerance"] == 0.05


def test_gates_default_to_the_settings_and_the_models_sla(model, settings):
    settings.DMX_CANARY_MIN_REQUESTS = 7
    settings.DMX_CANARY_ERROR_TOLERANCE = 0.02
    version = started(model, percent=20)
    assert CanaryGates.of(version) == CanaryGates(
        min_requests=7, error_tolerance=0.02, latency_p95_ms=800
    )
    assert version.canary_steps == [20.0] and version.canary_last_step


@pytest.mark.parametrize(
    ("percent", "steps", "field"),
    [
        (0, [], "percent"),
        (150, [], "percent"),
        (50, [25], "steps"),
        (5, [50, 50], "steps"),
        (5, [101], "steps"),
        (5, [float("nan")], "steps"),
    ],
)
def test_a_ramp_that_does_not_climb_to_at_most_100_is_refused(model, percent, steps, field):
    with pytest.raises(ValidationError) as refused:
        canary_start(
            version=model_version_create(model=model, tag="v2"), percent=percent, steps=steps
        )
    assert field in refused.value.message_dict
    assert not ModelVersion.objects.get(model=model, tag="v2").is_canary


def test_the_only_stable_version_cannot_become_a_canary(model):
    with pytest.raises(ValidationError):
        canary_start(version=ModelVersion.objects.get(model=model, tag="v1"), percent=10)


def test_an_operator_starts_a_canary_from_the_admin(model, client):
    version = model_version_create(model=model, tag="v2")
    operator = make_staff("operator")
    client.force_login(operator)
    assert "Start a canary" in client.get("/admin/routing/canary/").content.decode()
    form = client.get("/admin/routing/canary/start/")
    assert form.status_code == 200 and 'name="steps"' in form.content.decode()
    refused = client.post(
        "/admin/routing/canary/start/", {"version": version.id, "percent": "30", "steps": "20"}
    )
    assert refused.status_code == 200 and "Each step takes more" in refused.content.decode()
    response = client.post(
        "/admin/routing/canary/start/",
        {
            "version": version.id,
            "percent": "5",
            "steps": "25, 50, 100",
            "min_requests": "40",
            "latency_p95_ms": "",
            "error_tolerance": "",
        },
    )
    assert response.status_code == 302
    version.refresh_from_db()
    assert version.canary_steps == [5.0, 25.0, 50.0, 100.0]
    assert CanaryGates.of(version) == CanaryGates(
        min_requests=40, error_tolerance=0.01, latency_p95_ms=800
    )
    listed = client.get("/admin/routing/canary/").content.decode()
    assert "1 of 4" in listed and "40 requests" in listed and "≤ 800 ms" in listed
    event = CanaryEvent.objects.get(version=version)
    assert event.action == CanaryAction.START and event.operator == operator


def test_a_viewer_cannot_start_a_canary(model, client):
    version = model_version_create(model=model, tag="v2")
    client.force_login(make_staff("viewer"))
    assert "Start a canary" not in client.get("/admin/routing/canary/").content.decode()
    response = client.post(
        "/admin/routing/canary/start/", {"version": version.id, "percent": "5", "steps": ""}
    )
    assert response.status_code == 403
    assert not ModelVersion.objects.get(id=version.id).is_canary


def test_a_rollback_while_an_evaluation_was_due_stands(model, key):
    version = started(model, percent=5, steps=[50, 100], gates=GATES)
    serve(key, model, 10)  # enough for the step to pass: an evaluation would advance it
    stale = ModelVersion.objects.get(id=version.id)  # as an admin page or the evaluator read it
    event = canary_rollback(version=version, operator=make_staff("operator"))
    assert event.action == CanaryAction.ROLLBACK and not event.automatic

    assert canary_evaluate(version_id=version.id) is None
    for undo in (canary_promote, canary_rollback):
        with pytest.raises(ValidationError) as refused:
            undo(version=stale)
        assert "no longer a canary" in str(refused.value.message_dict["version"])
    version.refresh_from_db()
    assert (float(version.canary_percent), version.canary_step) == (0, 0)
    assert not version.is_stable and ModelVersion.objects.get(model=model, tag="v1").is_stable
    actions = CanaryEvent.objects.filter(version=version).values_list("action", flat=True)
    assert sorted(actions) == ["rollback", "start"]


def test_an_evaluations_promotion_is_not_rolled_back_by_a_stale_page(model, key):
    version = started(model, percent=50, gates=GATES)
    serve(key, model, 10)
    stale = ModelVersion.objects.get(id=version.id)
    assert canary_evaluate(version_id=version.id).action == CanaryAction.PROMOTE
    with pytest.raises(ValidationError):
        canary_rollback(version=stale)
    version.refresh_from_db()
    assert version.is_stable and not ModelVersion.objects.get(model=model, tag="v1").is_stable


def test_partial_gates_take_the_defaults_for_the_rest(model, settings):
    settings.DMX_CANARY_ERROR_TOLERANCE = 0.03
    version = started(model, percent=20, gates=CanaryGates(min_requests=12))
    assert CanaryGates.of(version) == CanaryGates(
        min_requests=12, error_tolerance=0.03, latency_p95_ms=800
    )
    # Stored at the start: a later change of the settings leaves a running canary's gates.
    settings.DMX_CANARY_ERROR_TOLERANCE = 0.5
    assert CanaryGates.of(version).error_tolerance == 0.03
    start = CanaryEvent.objects.get(version=version, action=CanaryAction.START)
    assert start.figures["gates"] == {
        "min_requests": 12,
        "error_tolerance": 0.03,
        "latency_p95_ms": 800,
    }
