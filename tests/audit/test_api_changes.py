"""Changes made through the management API leave audit entries naming the token's user and
the token, with before and after: DRF authenticates tokens after the audit log's middleware
ran, so the views name the actor themselves."""

from __future__ import annotations

import pytest
from auditlog.models import LogEntry
from django.db.models.signals import pre_save

from apps.keys.choices import MemberRole
from apps.keys.models import KEY_PREFIX, ApiKey, Invitation
from apps.routing.models import RoutingRule
from dmxplatform import credentials
from tests.api.conftest import API, Caller, as_caller, as_staff
from tests.audit.conftest import last_entry
from tests.keys.factories import make_api_key, make_member, make_tenant
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db

UPDATE, CREATE = LogEntry.Action.UPDATE, LogEntry.Action.CREATE


@pytest.fixture
def owner() -> Caller:
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER))


@pytest.fixture
def operator() -> Caller:
    return as_staff("operator")


def by(entry: LogEntry, caller: Caller) -> bool:
    """Whether `entry` names the caller as its actor and their token as the way they acted."""
    return entry.actor == caller.user and entry.additional_data == {
        "management_token": caller.token.token_id,
        "name": caller.token.name,
    }


def test_creating_a_key(owner):
    response = owner.client.post(
        f"{API}/keys", {"name": "ci", "requests_per_minute": 30}, format="json"
    )
    assert response.status_code == 201, response.content
    key = ApiKey.objects.get(key_id=response.json()["key_id"])
    entry = last_entry(key, CREATE)
    assert by(entry, owner) and entry.remote_addr == "127.0.0.1"
    assert entry.changes["name"] == [None, "ci"]
    assert entry.changes["requests_per_minute"] == [None, 30]
    # Neither the secret nor its hash is in the log.
    # The secret as the platform reads it: after the first "_" (the random part may hold more).
    _, secret = credentials.split(response.json()["secret"], KEY_PREFIX)
    assert entry.changes["secret_hash"] == ["", "(hidden)"]
    assert secret not in str(entry.changes) and key.secret_hash not in str(entry.changes)


def test_rotating_a_key_says_its_secret_changed_and_never_to_what(owner):
    key, _ = make_api_key(owner.tenant)
    old_hash = key.secret_hash
    response = owner.client.post(
        f"{API}/keys/{key.key_id}/rotate", {"grace_seconds": 600}, format="json"
    )
    assert response.status_code == 200, response.content
    entry = last_entry(key)
    assert by(entry, owner)
    assert entry.changes["secret_hash"] == ["(hidden)", "(hidden)"]
    assert entry.changes["previous_secret_hash"] == ["", "(hidden)"]
    assert entry.changes["previous_secret_expires_at"][0] is None
    key.refresh_from_db()
    assert old_hash not in str(entry.changes) and key.secret_hash not in str(entry.changes)


def test_revoking_a_key(owner):
    key, _ = make_api_key(owner.tenant)
    assert owner.client.post(f"{API}/keys/{key.key_id}/revoke").status_code == 200
    entry = last_entry(key)
    assert by(entry, owner) and list(entry.changes) == ["revoked_at"]
    assert entry.changes["revoked_at"][0] is None and entry.changes["revoked_at"][1]


def test_inviting_a_member(owner, mailoutbox):
    response = owner.client.post(
        f"{API}/invitations", {"email": "new@example.com", "role": "owner"}, format="json"
    )
    assert response.status_code == 201, response.content
    invitation = Invitation.objects.get(tenant=owner.tenant, email="new@example.com")
    entry = last_entry(invitation, CREATE)
    assert by(entry, owner)
    assert entry.changes["email"] == [None, "new@example.com"]
    assert entry.changes["role"] == [None, "owner"]
    assert entry.changes["token_hash"] == ["", "(hidden)"]


def test_draining_a_node(operator, node):
    assert operator.client.post(f"{API}/nodes/{node.id}/drain").status_code == 200
    entry = last_entry(node)
    assert by(entry, operator) and entry.changes == {"drained": [False, True]}


def test_changing_a_routing_rule(operator):
    model, _ = make_model("audit-api-rule")
    rule = RoutingRule.objects.create(alias="auto", intent="code", model=model, weight=1.0)
    response = operator.client.patch(
        f"{API}/routing-rules/{rule.id}", {"weight": 2.5, "is_active": False}, format="json"
    )
    assert response.status_code == 200, response.content
    entry = last_entry(rule)
    assert by(entry, operator)
    assert entry.changes == {"weight": [1.0, 2.5], "is_active": [True, False]}


def test_a_session_caller_is_named_by_the_middleware(client):
    """The portal's session: Django knows the user before DRF does; no token to record."""
    membership = make_member(make_tenant(), role=MemberRole.OWNER)
    client.force_login(membership.user)
    session = client.session
    session["dmx_tenant_id"] = membership.tenant_id
    session.save()
    key, _ = make_api_key(membership.tenant)
    response = client.post(f"{API}/keys/{key.key_id}/revoke")
    assert response.status_code == 200, response.content
    entry = last_entry(key)
    assert entry.actor == membership.user and entry.additional_data is None


def test_token_calls_leave_no_signal_receivers_behind(owner):
    """Naming the actor nests a context in the middleware's; both are undone at the end."""
    key, _ = make_api_key(owner.tenant)

    def rotate() -> None:
        path = f"{API}/keys/{key.key_id}/rotate"
        assert owner.client.post(path, {"grace_seconds": 0}, format="json").status_code == 200

    rotate()  # whatever connects lazily is connected now
    connected = len(pre_save.receivers)
    for _ in range(3):
        rotate()
    assert len(pre_save.receivers) == connected
    assert LogEntry.objects.get_for_object(key).filter(action=UPDATE).count() == 4
