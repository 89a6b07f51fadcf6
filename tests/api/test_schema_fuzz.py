"""Fuzz /api/v1/ with requests generated from its own schema, /api/schema/ (schemathesis).

Every operation, in schemathesis's examples, coverage (boundary values, wrong types, missing
fields) and fuzzing phases, a bounded number of cases each; sent in-process to Django's WSGI
application, in the test's transaction, as an operator who owns a tenant, with a write token.
In about half of the cases the path's ids are those of real objects (the caller's keys, a
teammate, an open invitation, a second token of its own, another tenant, a plan, a node, a
routing rule, a budget, a model version, a code batch), so that bodies reach the services
instead of ending in a 404.

Checked on every response: no server error, and every error in the platform's shape.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from decimal import Decimal

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from apps.billing.services import budget_set, codes_generate
from apps.hardware.models import Node
from apps.keys.choices import MemberRole
from apps.keys.models import Plan
from apps.keys.services import member_invite
from apps.routing.choices import RecomputationStatus
from apps.routing.models import RoutingRule, WeightRecomputation
from apps.routing.services import canary_start
from tests.api.conftest import as_caller, as_staff, record_usage
from tests.fuzz import ERROR_FIELDS, fuzz_config
from tests.hardware.factories import make_node_token
from tests.keys.factories import make_api_key, make_member, make_tenant
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db

# Generated cases per operation in the fuzzing phase, on top of the schema's examples and the
# coverage phase's: the whole module stays near a minute on two cores.
MAX_EXAMPLES = 15
CONFIG = fuzz_config(max_examples=MAX_EXAMPLES)
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(), config=CONFIG)


@pytest.fixture
def in_process() -> Iterator[None]:
    """Keep the test's connection across requests, as Django's test client does: closing
    "old" connections at a request's start and end would end the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def world(in_process, mailoutbox) -> dict:
    """The caller's token, and the real ids the path parameters may take, by resource."""
    caller = as_staff("operator")
    membership = caller.membership
    tenant = membership.tenant
    key, _ = make_api_key(tenant, token_quota=1000)
    record_usage(key)
    invitation = member_invite(
        tenant=tenant,
        email="fuzz-invitee@example.com",
        role=MemberRole.MEMBER,
        invited_by=membership.user,
        accept_url=lambda token: f"http://testserver/invitations/{token}/",
    )
    _, version = make_model("fuzz-model")
    node = Node.objects.create(
        name="fuzz-node",
        url="http://127.0.0.1:1",
        model_version=version,
        served_model_name="fuzz-model",
        max_model_len=128,
        token=make_node_token()[0],
        registered_at=key.created_at,
        last_heartbeat_at=key.created_at,
    )
    return {
        "authorization": f"Bearer {caller.secret}",
        "ids": {
            ("keys", "key_id"): key.key_id,
            # Not the caller's own membership, token or tenant: a case that demoted, revoked
            # or suspended those would turn every later case into a 403, 401 or 404.
            ("members", "id"): make_member(tenant).id,
            ("invitations", "id"): invitation.id,
            ("tokens", "token_id"): as_caller(membership).token.token_id,
            ("tenants", "id"): make_tenant().id,
            ("plans", "id"): Plan.objects.create(name="fuzz-plan").id,
            ("nodes", "id"): node.id,
            ("routing-rules", "id"): RoutingRule.objects.create(
                alias="fuzz", model=version.model
            ).id,
            ("canaries", "id"): canary_start(
                version=make_model("fuzz-model", version="v2")[1], percent=10
            ).id,
            ("billing", "id"): budget_set(
                tenant_id=tenant.id, period="month", amount=Decimal(5)
            ).id,
            ("model-versions", "id"): version.id,
            ("redemption-batches", "id"): codes_generate(face_value=Decimal(1), count=1)[0].id,
            ("weight-recomputations", "id"): WeightRecomputation.objects.create(
                window_start=key.created_at,
                window_end=key.created_at,
                status=RecomputationStatus.PROPOSED,
                changes=[],
            ).id,
        },
    }


def _share(case) -> bool:
    """About half of the cases, chosen by their content: a replay picks the same ones."""
    seen = json.dumps([case.path_parameters, case.body], sort_keys=True, default=repr)
    return zlib.crc32(seen.encode()) % 2 == 0


def bound(case, ids: dict) -> None:
    """Point a share of the cases at real objects; everything else stays as generated."""
    if not case.path_parameters or not _share(case):
        return
    resource = case.path.removeprefix("/api/v1/").split("/")[0]
    case.path_parameters = {
        name: ids.get((resource, name), value) for name, value in case.path_parameters.items()
    }


def platform_error_shape(ctx, response, case) -> None:
    """An error is {"error": {"message", "type", "param", "code"}} with a message."""
    if response.status_code < 400:
        return
    content_type = (response.headers.get("content-type") or [""])[0]
    text = response.content.decode("utf-8", "replace")
    assert content_type.startswith("application/json"), f"{content_type!r}: {text[:300]}"
    body = json.loads(response.content)
    assert isinstance(body, dict) and set(body) == {"error"}, text[:300]
    assert set(body["error"]) == ERROR_FIELDS, text[:300]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], text[:300]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    # Shrinking would resend many requests: report the first failure as found.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_management_api_schema(case, world):
    bound(case, world["ids"])
    response = case.call(headers={"Authorization": world["authorization"]})
    case.validate_response(response, checks=[not_a_server_error, platform_error_shape])
