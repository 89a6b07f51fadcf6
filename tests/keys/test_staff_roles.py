"""The console's roles: a viewer sees every page and changes nothing, actions included; an
operator runs them. Every custom admin action must declare the operate permission, and the
groups must cover every model of the platform's apps."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission

from apps.keys.models import ApiKey
from tests.keys.factories import make_api_key, make_staff

pytestmark = pytest.mark.django_db
PLATFORM_APPS = ("keys", "billing", "models", "hardware", "routing", "gateway", "batches")


def test_the_groups_cover_every_model_of_the_platform():
    ours = Permission.objects.filter(content_type__app_label__in=PLATFORM_APPS)
    # Beside these, both read the audit log (keys/0007, tests/audit/test_admin.py).
    outside = {"content_type__app_label": "auditlog", "codename": "view_logentry"}
    operator = set(Group.objects.get(name="operator").permissions.exclude(**outside))
    viewer = set(Group.objects.get(name="viewer").permissions.exclude(**outside))
    assert set(ours) == operator, "a new model's permissions belong to the operator group"
    assert {p for p in ours if p.codename.startswith("view_")} == viewer


def test_every_custom_action_runs_only_for_those_who_may_operate():
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in PLATFORM_APPS:
            continue  # viewers have no permission on other apps' models: they see none of them
        for name in getattr(model_admin, "actions", None) or ():
            action = getattr(model_admin, name) if isinstance(name, str) else name
            assert "operate" in getattr(action, "allowed_permissions", ()), (
                f"{model.__name__} admin: action {name} runs for viewers too"
            )


def test_a_viewer_sees_keys_and_cannot_revoke_them(client):
    key, _ = make_api_key()
    client.force_login(make_staff("viewer"))
    page = client.get("/admin/keys/apikey/")
    assert page.status_code == 200 and key.name in page.content.decode()
    assert 'value="revoke"' not in page.content.decode()
    client.post("/admin/keys/apikey/", {"action": "revoke", "_selected_action": [key.id]})
    assert ApiKey.objects.get(id=key.id).revoked_at is None
    assert client.get(f"/admin/keys/apikey/{key.id}/change/").status_code == 200  # read-only


def test_an_operator_revokes(client):
    key, _ = make_api_key()
    client.force_login(make_staff("operator"))
    page = client.get("/admin/keys/apikey/").content.decode()
    assert 'value="revoke"' in page
    client.post("/admin/keys/apikey/", {"action": "revoke", "_selected_action": [key.id]})
    assert ApiKey.objects.get(id=key.id).revoked_at is not None
