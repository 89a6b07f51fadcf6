"""The audit log in the console: both roles read and search it; nobody, superusers included,
adds, changes or deletes an entry."""

from __future__ import annotations

import pytest
from auditlog.models import LogEntry
from django.contrib.auth.models import Group, User

from apps.keys.services import api_key_revoke
from tests.audit.conftest import last_entry
from tests.keys.factories import make_api_key, make_staff

pytestmark = pytest.mark.django_db

LOG = "/admin/auditlog/logentry/"


@pytest.fixture
def entry(client) -> LogEntry:
    """A key revoked by an operator in the console."""
    key, _ = make_api_key(name="audited-key")
    client.force_login(make_staff("operator"))
    client.post("/admin/keys/apikey/", {"action": "revoke", "_selected_action": [key.id]})
    client.logout()
    return last_entry(key)


def test_both_roles_may_view_the_log_and_nothing_else_of_it():
    for role in ("operator", "viewer"):
        granted = Group.objects.get(name=role).permissions.filter(
            content_type__app_label="auditlog"
        )
        assert [p.codename for p in granted] == ["view_logentry"]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_staff_of_either_role_read_the_log(client, entry, role):
    client.force_login(make_staff(role))
    listed = client.get(LOG)
    assert listed.status_code == 200 and "audited-key" in listed.content.decode()
    shown = client.get(f"{LOG}{entry.id}/change/")
    assert shown.status_code == 200
    page = shown.content.decode()
    assert "Revoked at" in page or "revoked_at" in page
    assert 'name="_save"' not in page  # nothing to save


def test_the_log_is_searched_by_actor_object_and_change(client, entry):
    key, _ = make_api_key(name="other-key")
    api_key_revoke(key=key)  # by nobody: the platform itself
    client.force_login(make_staff("viewer"))
    for query in (entry.actor.email, entry.actor.username, "audited-key", "revoked_at"):
        page = client.get(LOG, {"q": query}).content.decode()
        assert "audited-key" in page, query
    assert "audited-key" not in client.get(LOG, {"q": "other-key"}).content.decode()


def test_a_viewer_cannot_change_or_delete_entries(client, entry):
    client.force_login(make_staff("viewer"))
    assert client.post(f"{LOG}{entry.id}/change/", {"action": 1}).status_code == 403
    assert client.post(f"{LOG}{entry.id}/delete/", {"post": "yes"}).status_code == 403
    assert LogEntry.objects.filter(id=entry.id).exists()


def test_not_even_a_superuser_adds_changes_or_deletes_entries(client, entry):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-long-1"))
    assert client.get(f"{LOG}add/").status_code == 403
    assert client.post(f"{LOG}{entry.id}/change/", {"action": 1}).status_code == 403
    assert client.post(f"{LOG}{entry.id}/delete/", {"post": "yes"}).status_code == 403
    listed = client.get(LOG).content.decode()
    assert "delete_selected" not in listed
    bulk = client.post(
        LOG, {"action": "delete_selected", "_selected_action": [entry.id], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)
    assert LogEntry.objects.filter(id=entry.id).exists()


def test_staff_without_a_role_find_no_log(client, entry):
    client.force_login(User.objects.create_user("plain", password="pw-long-1", is_staff=True))
    assert client.get(LOG).status_code == 403
