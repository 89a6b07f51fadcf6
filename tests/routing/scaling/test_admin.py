"""The admin of scaling: "evaluate now", backend checks on the policy form, read-only events."""

import html

import pytest

from apps.routing.choices import ScalerBackend, ScalingAction, ScalingTrigger
from apps.routing.models import ScalingEvent, ScalingPolicy
from tests.models.factories import make_model
from tests.routing.scaling.factories import NAMESPACE, make_policy, publish_node

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

CHANGELIST = "/admin/routing/scalingpolicy/"


def test_evaluate_now_scales_a_breaching_model_as_the_operator(admin_client, kube):
    kube.add(NAMESPACE, "unit-admin", replicas=1)
    policy = make_policy("unit-admin", breaches_to_scale_out=1)
    publish_node("unit-admin", waiting=50)

    response = admin_client.post(
        CHANGELIST, {"action": "evaluate_now", "_selected_action": [policy.pk]}, follow=True
    )

    assert response.status_code == 200
    event = ScalingEvent.objects.get(policy=policy)
    assert (event.trigger, event.action) == (ScalingTrigger.OPERATOR, ScalingAction.SCALE_OUT)
    assert kube.replicas(NAMESPACE, "unit-admin") == 2
    assert "1 -&gt; 2" in response.content.decode()


def test_the_policy_form_refuses_what_the_backend_cannot_use(admin_client):
    model, _ = make_model("unit-admin-form")
    form = {
        "model": model.pk,
        "backend": ScalerBackend.KUBERNETES,
        "min_replicas": 1,
        "max_replicas": 2,
        "target_queue_per_node": 4,
        "breaches_to_scale_out": 2,
        "calm_to_scale_in": 5,
        "cooldown_seconds": 120,
        "kubernetes_namespace": "",
        "kubernetes_deployment": "",
        "worker_arguments": "[]",
        "is_active": "on",
    }

    refused = admin_client.post(CHANGELIST + "add/", form)
    local = admin_client.post(
        CHANGELIST + "add/",
        {**form, "backend": ScalerBackend.LOCAL, "worker_arguments": '["--model", "/m"]'},
    )

    assert refused.status_code == 200 and "Required for the Kubernetes backend" in refused.text
    assert local.status_code == 302
    assert ScalingPolicy.objects.get(model=model).backend == ScalerBackend.LOCAL


def test_events_are_listed_but_cannot_be_added_or_changed(admin_client, kube):
    kube.add(NAMESPACE, "unit-admin", replicas=1)
    policy = make_policy("unit-admin", breaches_to_scale_out=1)
    publish_node("unit-admin", waiting=50)
    admin_client.post(CHANGELIST, {"action": "evaluate_now", "_selected_action": [policy.pk]})
    event = ScalingEvent.objects.get(policy=policy)

    listing = admin_client.get("/admin/routing/scalingevent/")
    detail = admin_client.get(f"/admin/routing/scalingevent/{event.pk}/change/")

    assert listing.status_code == 200 and html.escape(event.reason) in listing.text
    assert admin_client.get("/admin/routing/scalingevent/add/").status_code == 403
    assert detail.status_code == 200 and 'name="_save"' not in detail.text
