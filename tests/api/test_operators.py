"""Operators' endpoints: /tenants, /plans, /nodes (drain, undrain), /routing-rules. Staff only;
anyone else finds nothing there."""

from __future__ import annotations

import pytest

from apps.hardware.models import Node
from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.hardware.services import node_register, node_token_authenticate
from apps.keys.choices import TokenScope
from apps.keys.keycache import KeyRecord, record_key
from apps.keys.models import Plan, PlanQuota
from apps.routing.models import RoutingRule
from apps.routing.services import ROUTING_TABLE_VERSION
from dmxplatform.redis_client import sync_redis
from inference.wire import Registration
from tests.api.conftest import API, as_caller, error_of
from tests.hardware.factories import make_node_token
from tests.keys.factories import make_api_key, make_tenant
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(django_capture_on_commit_callbacks) -> Node:
    """A registered node, published to the live fleet state."""
    make_model("api-node-model")
    _, plaintext = make_node_token()
    with django_capture_on_commit_callbacks(execute=True):
        node, _ = node_register(
            token=node_token_authenticate(plaintext=plaintext),
            registration=Registration(
                name="api-node",
                url="http://127.0.0.1:1",
                model="api-node-model",
                version="v1",
                served_model_name="api-node-model",
                max_model_len=256,
            ),
        )
    return node


def live(node: Node) -> NodeSnapshot:
    return NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))


@pytest.mark.parametrize(
    "path", ["tenants", "plans", "nodes", "routing-rules", "tenants/1", "nodes/1/drain"]
)
def test_non_operators_find_nothing(owner, path):
    for response in (
        owner.client.get(f"{API}/{path}"),
        owner.client.post(f"{API}/{path}", {}, format="json"),
    ):
        assert response.status_code == 404 and error_of(response)["code"] == "not_found"


def test_a_read_only_operator_token_changes_nothing(operator, node):
    reader = as_caller(operator.membership, TokenScope.READ)
    assert reader.client.get(f"{API}/nodes").status_code == 200
    assert reader.client.post(f"{API}/nodes/{node.id}/drain").status_code == 403
    node.refresh_from_db()
    assert not node.drained


def test_tenants_listed_filtered_and_approved(operator):
    waiting = make_tenant(name="waiting")
    waiting.approved_at = None
    waiting.save()
    listed = operator.client.get(f"{API}/tenants", {"approved": "false"}).json()["results"]
    assert [row["id"] for row in listed] == [waiting.id]
    assert operator.client.get(f"{API}/tenants", {"approved": "soon"}).status_code == 400
    response = operator.client.post(f"{API}/tenants/{waiting.id}/approve")
    assert response.status_code == 200 and response.json()["approved_at"]
    waiting.refresh_from_db()
    assert waiting.is_approved


def test_tenant_plan_and_suspension_reach_its_keys(operator, django_capture_on_commit_callbacks):
    tenant = make_tenant()
    key, _ = make_api_key(tenant)
    plan = Plan.objects.create(name="gold", requests_per_minute=100)
    url = f"{API}/tenants/{tenant.id}"
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.client.patch(url, {"plan": plan.id, "is_active": False}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["plan"], response.json()["is_active"]) == (plan.id, False)
    record = KeyRecord.decode(sync_redis().get(record_key(key.key_id)))
    assert record.revoked and record.tenant_limits.requests_per_minute == 100
    missing = operator.client.patch(url, {"plan": 10**9}, format="json")
    assert missing.status_code == 400 and error_of(missing)["param"] == "plan"


def test_plans_with_their_quotas(operator, django_capture_on_commit_callbacks):
    created = operator.client.post(
        f"{API}/plans",
        {
            "name": "team",
            "tokens_per_minute": 10_000,
            "quotas": [
                {"period": "month", "model": "", "tokens": 1_000_000},
                {"period": "day", "model": "dmx-tiny", "tokens": 50_000},
            ],
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    plan = Plan.objects.get(id=created.json()["id"])
    assert plan.tokens_per_minute == 10_000 and plan.quotas.count() == 2
    tenant = make_tenant()
    tenant.plan = plan
    tenant.save()
    key, _ = make_api_key(tenant)
    url = f"{API}/plans/{plan.id}"
    with django_capture_on_commit_callbacks(execute=True):
        changed = operator.client.patch(
            url, {"quotas": [{"period": "hour", "model": "", "tokens": 500}]}, format="json"
        )
    assert changed.status_code == 200, changed.content
    assert changed.json()["quotas"] == [{"period": "hour", "model": "", "tokens": 500}]
    record = KeyRecord.decode(sync_redis().get(record_key(key.key_id)))
    assert [(q.period, q.tokens) for q in record.quotas] == [("hour", 500)]
    renamed = operator.client.patch(url, {"description": "for teams"}, format="json")
    assert renamed.json()["quotas"] == changed.json()["quotas"]  # no quotas given: kept
    in_use = operator.client.delete(url)
    assert in_use.status_code == 400 and Plan.objects.filter(id=plan.id).exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "name": "twice",
                "quotas": [
                    {"period": "day", "model": "", "tokens": 1},
                    {"period": "day", "model": "", "tokens": 2},
                ],
            },
            "quotas",
        ),
        (
            {"name": "zero", "quotas": [{"period": "day", "model": "", "tokens": 0}]},
            "quotas.tokens",
        ),
        ({"name": "taken"}, "name"),
    ],
)
def test_bad_plans_are_a_400_and_leave_nothing(operator, body, param):
    Plan.objects.create(name="taken")
    plans = set(Plan.objects.values_list("id", flat=True))
    response = operator.client.post(f"{API}/plans", body, format="json")
    assert response.status_code == 400 and error_of(response)["param"] == param
    assert set(Plan.objects.values_list("id", flat=True)) == plans
    assert not PlanQuota.objects.filter(plan__name=body["name"]).exists()


def test_an_unused_plan_is_deleted(operator):
    plan = Plan.objects.create(name="spare")
    assert operator.client.delete(f"{API}/plans/{plan.id}").status_code == 204
    assert not Plan.objects.filter(id=plan.id).exists()


def test_nodes_drain_and_undrain(operator, node, django_capture_on_commit_callbacks):
    listed = operator.client.get(f"{API}/nodes").json()["results"]
    assert [(row["name"], row["drained"], row["model"]) for row in listed] == [
        ("api-node", False, "api-node-model")
    ]
    with django_capture_on_commit_callbacks(execute=True):
        drained = operator.client.post(f"{API}/nodes/{node.id}/drain")
    assert drained.status_code == 200 and drained.json()["drained"] is True
    node.refresh_from_db()
    assert node.drained and live(node).drained
    only = operator.client.get(f"{API}/nodes", {"drained": "true"}).json()["results"]
    assert [row["id"] for row in only] == [node.id]
    with django_capture_on_commit_callbacks(execute=True):
        undrained = operator.client.post(f"{API}/nodes/{node.id}/undrain")
    assert undrained.json()["drained"] is False
    node.refresh_from_db()
    assert not node.drained and not live(node).drained
    assert operator.client.get(f"{API}/nodes/{node.id + 1000}").status_code == 404


def test_routing_rules_through_the_routing_table(operator, django_capture_on_commit_callbacks):
    make_model("api-rule-model")
    version_key = ROUTING_TABLE_VERSION.key
    before = int(sync_redis().get(version_key) or 0)
    with django_capture_on_commit_callbacks(execute=True):
        created = operator.client.post(
            f"{API}/routing-rules",
            {"alias": "auto", "intent": "code", "model": "api-rule-model", "weight": 2.5},
            format="json",
        )
    assert created.status_code == 201, created.content
    assert int(sync_redis().get(version_key)) == before + 1  # gateways reload the table
    rule = RoutingRule.objects.get(id=created.json()["id"])
    assert (rule.alias, rule.model.name, rule.weight) == ("auto", "api-rule-model", 2.5)
    again = operator.client.post(
        f"{API}/routing-rules",
        {"alias": "auto", "intent": "code", "model": "api-rule-model"},
        format="json",
    )
    assert again.status_code == 400
    unknown = operator.client.post(
        f"{API}/routing-rules", {"alias": "auto", "model": "no-such-model"}, format="json"
    )
    assert unknown.status_code == 400 and error_of(unknown)["param"] == "model"
    url = f"{API}/routing-rules/{rule.id}"
    assert created.json()["tier"] is None  # none: the key's tier
    changed = operator.client.patch(
        url, {"weight": 0.5, "hardware_preference": ["h100"], "tier": 0}, format="json"
    )
    assert changed.status_code == 200, changed.content
    rule.refresh_from_db()
    assert (rule.weight, rule.hardware_preference, rule.tier) == (0.5, ["h100"], 0)
    no_such_tier = operator.client.patch(url, {"tier": 7}, format="json")
    assert no_such_tier.status_code == 400 and error_of(no_such_tier)["param"] == "tier"
    huge = operator.client.patch(url, b'{"weight": 1e999}', content_type="application/json")
    assert huge.status_code == 400 and error_of(huge)["param"] == "weight"
    with django_capture_on_commit_callbacks(execute=True):
        assert operator.client.delete(url).status_code == 204
    assert not RoutingRule.objects.filter(id=rule.id).exists()
    assert int(sync_redis().get(version_key)) == before + 2
