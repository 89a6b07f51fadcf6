"""Every change an operator makes in the console leaves an audit entry naming them, with the
fields' values before and after: edit forms, and the custom actions, including those whose
services write with queryset.update() or keep their state in Redis."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from auditlog.models import LogEntry
from django.test import AsyncClient
from django.utils import timezone

from apps.gateway.models import SensitiveTerm
from apps.gateway.services import sensitive_term_create
from apps.hardware.models import NodeToken
from apps.keys.models import Plan
from apps.keys.services import tenant_sign_up
from apps.models.services import model_version_create
from apps.routing.breaker import breakers_key
from apps.routing.choices import RecomputationStatus
from apps.routing.models import RoutingRule, WeightRecomputation
from apps.routing.services import canary_start
from dmxplatform.redis_client import sync_redis
from tests.audit.conftest import last_entry
from tests.hardware.factories import make_node_token
from tests.keys.factories import make_api_key, make_staff, make_user
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db

UPDATE, CREATE = LogEntry.Action.UPDATE, LogEntry.Action.CREATE


@pytest.fixture
def operator(client):
    user = make_staff("operator")
    client.force_login(user)
    return user


def percents(entry: LogEntry) -> list[Decimal]:
    """A canary's share before and after (a decimal, as text or a number)."""
    return [Decimal(str(value)) for value in entry.changes["canary_percent"]]


def act(client, path: str, action: str, *objects) -> None:
    """Run a changelist's custom action on `objects`, as the button does."""
    response = client.post(
        path, {"action": action, "_selected_action": [str(o.pk) for o in objects]}
    )
    assert response.status_code == 302, response.content.decode()[:500]


def test_editing_a_plans_limits(client, operator):
    plan = Plan.objects.create(name="team", requests_per_minute=60, tokens_per_minute=1000)
    response = client.post(
        f"/admin/keys/plan/{plan.id}/change/",
        {
            "name": "team",
            "description": "",
            "requests_per_minute": "120",
            "tokens_per_minute": "1000",
            "max_concurrent_requests": "4",
            "price_multiplier": "1.0000",
            "quotas-TOTAL_FORMS": "0",
            "quotas-INITIAL_FORMS": "0",
            "quotas-MIN_NUM_FORMS": "0",
            "quotas-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = last_entry(plan)
    assert entry.actor == operator
    assert entry.changes == {"requests_per_minute": [60, 120], "max_concurrent_requests": [None, 4]}


def test_editing_a_node_token(client, operator):
    token, _ = make_node_token("rack-1")
    response = client.post(
        f"/admin/hardware/nodetoken/{token.id}/change/",
        {
            "name": "rack-2",
            "revoked_at_0": timezone.now().strftime("%Y-%m-%d"),
            "revoked_at_1": "12:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert NodeToken.objects.get(id=token.id).name == "rack-2"
    entry = last_entry(token)
    assert entry.actor == operator
    assert entry.changes["name"] == ["rack-1", "rack-2"]
    assert entry.changes["revoked_at"][0] is None and entry.changes["revoked_at"][1]


def test_a_node_tokens_creation_never_shows_its_hash(client, operator):
    token, plaintext = make_node_token("rack-3")
    changes = last_entry(token, CREATE).changes
    assert changes["secret_hash"] == ["", "(hidden)"]
    assert token.secret_hash not in str(changes) and plaintext not in str(changes)


def test_revoking_a_key(client, operator):
    key, _ = make_api_key()
    act(client, "/admin/keys/apikey/", "revoke", key)
    entry = last_entry(key)
    assert entry.actor == operator and entry.actor_email == operator.email
    assert list(entry.changes) == ["revoked_at"] and entry.changes["revoked_at"][0] is None


def test_approving_a_tenant(client, operator, settings):
    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = True
    tenant = tenant_sign_up(user=make_user())
    act(client, "/admin/keys/tenant/", "approve", tenant)
    entry = last_entry(tenant)
    assert entry.actor == operator
    assert entry.changes["approved_at"][0] is None and entry.changes["approved_at"][1]


def test_draining_a_node(client, operator, node):
    act(client, "/admin/hardware/node/", "drain", node)
    entry = last_entry(node)
    assert entry.actor == operator and entry.changes == {"drained": [False, True]}


def test_activating_and_deactivating_terms_one_entry_per_changed_term(client, operator):
    on = sensitive_term_create(term="alpha-term")
    off = sensitive_term_create(term="beta-term", is_active=False)
    act(client, "/admin/gateway/sensitiveterm/", "deactivate", on, off)
    assert SensitiveTerm.objects.filter(is_active=True).count() == 0
    entry = last_entry(on)
    assert entry.actor == operator and entry.changes == {"is_active": [True, False]}
    # The term that was off already did not change: nothing to say about it.
    assert not LogEntry.objects.get_for_object(off).filter(action=UPDATE).exists()

    act(client, "/admin/gateway/sensitiveterm/", "activate", on, off)
    assert last_entry(off).changes == {"is_active": [False, True]}
    assert last_entry(on).changes == {"is_active": [False, True]}


def test_approving_a_weight_recomputation(client, operator):
    model, _ = make_model("audit-weights")
    rule = RoutingRule.objects.create(alias="auto", model=model, weight=1.0)
    now = timezone.now()
    recomputation = WeightRecomputation.objects.create(
        window_start=now - timedelta(days=1),
        window_end=now,
        status=RecomputationStatus.PROPOSED,
        changes=[
            {"rule": rule.id, "alias": "auto", "intent": "", "model": model.name, "old": 1.0,
             "new": 1.3, "figures": {}}
        ],
    )  # fmt: skip
    act(client, "/admin/routing/weightrecomputation/", "approve", recomputation)
    rule_entry = last_entry(rule)
    assert rule_entry.actor == operator and rule_entry.changes == {"weight": [1.0, 1.3]}
    decided = last_entry(recomputation)
    assert decided.actor == operator
    assert decided.changes["status"] == ["proposed", "applied"]
    assert decided.changes["decided_by"] == [None, operator.pk]


def test_promoting_a_canary_records_both_versions(client, operator):
    model, stable = make_model("audit-canary")
    canary = canary_start(version=model_version_create(model=model, tag="v2"), percent=10)
    act(client, "/admin/routing/canary/", "promote", canary)
    promoted = last_entry(canary)
    assert promoted.actor == operator
    assert promoted.changes["is_stable"] == [False, True]
    assert percents(promoted) == [10, 0]
    # The old stable version was demoted with queryset.update(): an entry all the same.
    demoted = last_entry(stable)
    assert demoted.actor == operator and demoted.changes == {"is_stable": [True, False]}


def test_rolling_a_canary_back(client, operator):
    model, _ = make_model("audit-rollback")
    canary = canary_start(version=model_version_create(model=model, tag="v2"), percent=25)
    act(client, "/admin/routing/canary/", "rollback", canary)
    entry = last_entry(canary)
    assert entry.actor == operator and percents(entry) == [25, 0]


def test_resetting_an_open_breaker(client, operator, node):
    opened_ms = int(time.time() * 1000)
    sync_redis().hset(breakers_key(), str(node.id), f"open 5 {opened_ms}")
    act(client, "/admin/routing/nodebreaker/", "reset", node)
    assert sync_redis().hget(breakers_key(), str(node.id)) is None
    entry = last_entry(node)
    assert entry.actor == operator
    assert entry.changes == {"breaker": ["open", "closed"], "breaker_failures": [5, 0]}


def test_resetting_a_closed_breaker_says_nothing(client, operator, node):
    act(client, "/admin/routing/nodebreaker/", "reset", node)
    assert not LogEntry.objects.get_for_object(node).filter(action=UPDATE).exists()


def test_the_actor_is_named_over_asgi_too(client, operator):
    """Production serves the admin through the ASGI handler, where auditlog's middleware (sync
    only) runs in a thread: the actor it names must reach the view's changes there as well."""
    key, _ = make_api_key()
    over_asgi = AsyncClient()
    over_asgi.cookies = client.cookies  # operator's session
    response = async_to_sync(over_asgi.post)(
        "/admin/keys/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]}
    )
    assert response.status_code == 302
    entry = last_entry(key)
    assert entry.actor == operator and entry.changes["revoked_at"][0] is None
