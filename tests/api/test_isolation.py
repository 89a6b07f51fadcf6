"""A tenant never sees, changes or learns of another tenant's objects: every operation in the
schema, called by tenant B's owner on tenant A's objects, is a 404, and B's lists hold nothing
of A's. Operators' endpoints are a 404 for everyone else.

The operations come from /api/schema/, not from a list kept here: a new endpoint is walked as
soon as it exists, and a path parameter this test cannot fill makes it fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal

import pytest
from django.urls import resolve
from rest_framework.test import APIClient

from apps.billing.services import budget_set, codes_generate, top_up
from apps.hardware.models import Node
from apps.keys.choices import MemberRole
from apps.keys.models import Plan
from apps.keys.services import member_invite
from apps.routing.choices import RecomputationStatus
from apps.routing.models import RoutingRule, WeightRecomputation
from apps.routing.services import canary_start
from dmxplatform.api import Operator
from tests.api.conftest import API, Caller, as_caller, error_of, record_usage
from tests.hardware.factories import make_node_token
from tests.keys.factories import make_api_key, make_member, make_tenant
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class TenantA:
    owner: Caller
    path_ids: dict[tuple[str, str], object]  # (resource, parameter) -> one of A's ids
    markers: list[str]  # text that only A's objects carry


@pytest.fixture
def tenant_a(django_capture_on_commit_callbacks, mailoutbox) -> TenantA:
    tenant = make_tenant(name="Alpha Corp", slug="alpha-corp-marker")
    owner = as_caller(make_member(tenant, role=MemberRole.OWNER))
    teammate = make_member(tenant, role=MemberRole.MEMBER)
    key, _ = make_api_key(tenant, name="alpha-key-marker", token_quota=5000)
    request_id = record_usage(key, created_at=time.time() - 60)
    invitation = member_invite(
        tenant=tenant,
        email="alpha-invitee-marker@example.com",
        role=MemberRole.MEMBER,
        invited_by=owner.user,
        accept_url=lambda token: f"http://testserver/invitations/{token}/",
    )
    plan = Plan.objects.create(name="alpha-plan")
    _, version = make_model("alpha-model")
    node = Node.objects.create(
        name="alpha-node",
        url="http://127.0.0.1:1",
        model_version=version,
        served_model_name="alpha-model",
        max_model_len=128,
        token=make_node_token()[0],
        registered_at=key.created_at,
        last_heartbeat_at=key.created_at,
    )
    rule = RoutingRule.objects.create(alias="alpha", model=version.model)
    canary = canary_start(version=make_model("alpha-model", version="v2")[1], percent=10)
    recomputation = WeightRecomputation.objects.create(
        window_start=key.created_at,
        window_end=key.created_at,
        status=RecomputationStatus.PROPOSED,
        changes=[],
    )
    budget = budget_set(tenant_id=tenant.id, period="month", amount=Decimal(5))
    top_up(tenant_id=tenant.id, amount=Decimal(3), actor="test", note="alpha-top-up-marker")
    batch, _ = codes_generate(face_value=Decimal(1), count=1)
    return TenantA(
        owner=owner,
        path_ids={
            ("keys", "key_id"): key.key_id,
            ("members", "id"): teammate.id,
            ("invitations", "id"): invitation.id,
            ("tokens", "token_id"): owner.token.token_id,
            ("tenants", "id"): tenant.id,
            ("plans", "id"): plan.id,
            ("nodes", "id"): node.id,
            ("routing-rules", "id"): rule.id,
            ("canaries", "id"): canary.id,
            ("weight-recomputations", "id"): recomputation.id,
            ("billing", "id"): budget.id,
            ("model-versions", "id"): version.id,
            ("redemption-batches", "id"): batch.id,
        },
        markers=[
            key.key_id,
            "alpha-key-marker",
            request_id,
            owner.user.email,
            teammate.user.email,
            "alpha-invitee-marker",
            owner.token.token_id,
            "alpha-corp-marker",
            "alpha-top-up-marker",
        ],
    )


def operations() -> list[tuple[str, str, list[str]]]:
    """Every (method, path template, path parameters) the schema describes."""
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    found = []
    for path, item in schema["paths"].items():
        for method in (m for m in METHODS if m in item):
            parameters = item[method].get("parameters", [])
            found.append((method, path, [p["name"] for p in parameters if p["in"] == "path"]))
    return found


def filled(path: str, params: list[str], ids: dict) -> str:
    resource = path.removeprefix(f"{API}/").split("/")[0]
    for name in params:
        if (resource, name) not in ids:
            pytest.fail(f"no id of tenant A's for {{{name}}} in {path}: add one to tenant_a")
        path = path.replace(f"{{{name}}}", str(ids[resource, name]))
    return path


def is_operators(url: str) -> bool:
    view = resolve(url).func.view_class
    return Operator in view.permission_classes


def call(client: APIClient, method: str, url: str):
    return getattr(client, method)(url, {}, format="json")


def test_the_schema_is_walked_whole(tenant_a):
    walked = operations()
    assert len(walked) >= 30  # every resource of the issue, each with several operations
    assert {p for _, _, params in walked for p in params} == {"key_id", "id", "token_id"}


def test_another_tenants_owner_finds_nothing_of_a(tenant_a, stranger):
    lists_read = 0
    for method, path, params in operations():
        url = filled(path, params, tenant_a.path_ids)
        response = call(stranger.client, method, url)
        where = f"{method.upper()} {url}"
        if params or is_operators(url):
            assert response.status_code == 404, f"{where}: {response.status_code}"
            assert error_of(response)["code"] == "not_found", where
            continue
        assert response.status_code < 500, where
        text = response.content.decode()
        leaked = [marker for marker in tenant_a.markers if marker in text]
        assert not leaked, f"{where} shows tenant A's {leaked}"
        lists_read += method == "get"
    assert lists_read >= 6  # keys, usage records and days, quotas, models, members, ...


def test_as_themselves_the_ids_are_found(tenant_a, operator):
    """The other side of the walk: the ids the stranger was refused are real."""
    for method, path, params in operations():
        if method != "get" or not params:
            continue
        url = filled(path, params, tenant_a.path_ids)
        caller = operator if is_operators(url) else tenant_a.owner
        assert caller.client.get(url).status_code == 200, url


def test_tenant_a_sees_its_own_rows_in_the_lists(tenant_a):
    """Without this, a list that shows nothing to anyone would pass the stranger's walk."""
    lists = ("keys", "usage/records", "usage/daily", "quotas", "members", "invitations")
    for path in (*lists, "billing/movements"):
        text = tenant_a.owner.client.get(f"{API}/{path}").content.decode()
        assert any(marker in text for marker in tenant_a.markers), path
