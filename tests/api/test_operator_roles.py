"""The console's roles on the operator endpoints: a `viewer` reads every one of them and changes
nothing (403), the `operator` group and superusers change, as in the admin. Every operator
endpoint of /api/v1/ is walked, so that a new one cannot forget the check."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

import pytest
from django.urls import URLPattern, URLResolver
from django.utils import timezone

from apps.billing.services import codes_generate
from apps.hardware.models import Node
from apps.keys.models import Plan, Tenant
from apps.models.models import ModelVersion
from apps.models.services import model_version_create
from apps.routing.choices import RecomputationStatus
from apps.routing.models import RoutingRule, WeightRecomputation
from apps.routing.services import canary_start
from config import api_urls
from dmxplatform.api import OperatorApiMixin
from tests.api.conftest import API, as_caller, error_of
from tests.hardware.factories import make_node_token
from tests.keys.factories import make_member, make_staff, make_tenant, make_user
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db

UNSAFE = ("post", "put", "patch", "delete")


def _walk(patterns, prefix: str = ""):
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


OPERATOR_ROUTES = [
    (route, callback.view_class)
    for route, callback in _walk(api_urls.urlpatterns)
    if issubclass(getattr(callback, "view_class", object), OperatorApiMixin)
]


@pytest.fixture
def objects() -> dict[str, int]:
    """A real object of each operator resource, by the path's first segment."""
    model, _ = make_model(f"roles-{uuid.uuid4().hex[:6]}")
    stable = model.versions.get(tag="v1")
    canary = canary_start(version=model_version_create(model=model, tag="v2"), percent=10)
    moment = timezone.now()
    node = Node.objects.create(
        name=f"roles-node-{uuid.uuid4().hex[:6]}",
        url="http://127.0.0.1:1",
        model_version=stable,
        served_model_name=model.name,
        max_model_len=128,
        token=make_node_token()[0],
        registered_at=moment,
        last_heartbeat_at=moment,
    )
    rule = RoutingRule.objects.create(alias=f"roles-{uuid.uuid4().hex[:6]}", model=model)
    waiting = make_tenant()
    Tenant.objects.filter(id=waiting.id).update(approved_at=None)
    return {
        "tenants": waiting.id,
        "plans": Plan.objects.create(name=f"roles-{uuid.uuid4().hex[:6]}").id,
        "nodes": node.id,
        "routing-rules": rule.id,
        "canaries": canary.id,
        "model-versions": stable.id,
        "redemption-batches": codes_generate(face_value=Decimal(1), count=1)[0].id,
        "weight-recomputations": WeightRecomputation.objects.create(
            window_start=moment,
            window_end=moment,
            status=RecomputationStatus.PROPOSED,
            changes=[{"rule": rule.id, "old": rule.weight, "new": 3.5}],
        ).id,
    }


def calls(objects: dict[str, int], methods) -> list[tuple[str, str]]:
    """(method, url) of every operator endpoint's `methods`, its ids those of `objects`."""
    found = []
    for route, view_class in OPERATOR_ROUTES:
        resource = route.split("/", 1)[0]
        url = f"{API}/" + re.sub(r"<int:\w+>", str(objects[resource]), route)
        found += [(method, url) for method in methods if hasattr(view_class, method)]
    return found


def send(caller, method: str, url: str):
    return getattr(caller.client, method)(url, {}, format="json")


def test_every_operator_endpoint_is_walked(objects):
    walked = {url.removeprefix(f"{API}/") for _, url in calls(objects, UNSAFE)}
    assert {
        f"tenants/{objects['tenants']}/approve",
        "plans",
        f"nodes/{objects['nodes']}/drain",
        f"nodes/{objects['nodes']}/breaker/reset",
        f"routing-rules/{objects['routing-rules']}",
        f"canaries/{objects['canaries']}/rollback",
        f"weight-recomputations/{objects['weight-recomputations']}/apply",
    } <= walked


def test_a_viewer_reads_every_operator_endpoint_and_changes_nothing(viewer, objects):
    for _, url in calls(objects, ["get"]):
        assert viewer.client.get(url).status_code == 200, url
    unsafe = calls(objects, UNSAFE)
    assert len(unsafe) >= 15
    for method, url in unsafe:
        response = send(viewer, method, url)
        assert response.status_code == 403, (method, url, response.content)
        assert error_of(response)["code"] == "permission_denied"
    assert not Tenant.objects.get(id=objects["tenants"]).is_approved
    assert not Node.objects.get(id=objects["nodes"]).drained
    assert RoutingRule.objects.filter(id=objects["routing-rules"]).exists()
    assert Plan.objects.filter(id=objects["plans"]).exists()
    assert ModelVersion.objects.get(id=objects["canaries"]).is_canary
    recomputation = WeightRecomputation.objects.get(id=objects["weight-recomputations"])
    assert recomputation.status == RecomputationStatus.PROPOSED


def test_a_viewer_in_the_session_is_refused_too(objects, client):
    client.force_login(make_staff("viewer"))
    response = client.post(f"{API}/nodes/{objects['nodes']}/drain")
    assert response.status_code == 403
    assert not Node.objects.get(id=objects["nodes"]).drained


def test_operators_and_superusers_change(operator, objects):
    for method, url in calls(objects, UNSAFE):
        response = send(operator, method, url)
        assert response.status_code != 403, (method, url, response.content)
    assert Node.objects.get(id=objects["nodes"]).drained is False  # drained, then undrained
    assert not ModelVersion.objects.get(id=objects["canaries"]).is_canary

    superuser = make_user(is_staff=True, is_superuser=True)
    caller = as_caller(make_member(make_tenant(), user=superuser))
    response = caller.client.post(f"{API}/nodes/{objects['nodes']}/drain")
    assert response.status_code == 200 and response.json()["drained"]
