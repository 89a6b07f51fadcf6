"""Sensitive terms in the database: the model, the filter built from it, and the reload signal."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from apps.gateway.choices import SensitiveTermAction
from apps.gateway.content_filter import FilterAction
from apps.gateway.models import SensitiveTerm
from apps.gateway.selectors import content_filter_load
from apps.gateway.services import (
    CONTENT_FILTER_VERSION,
    sensitive_term_bulk_set_active,
    sensitive_term_create,
    sensitive_term_delete,
    sensitive_term_import,
    sensitive_term_update,
)
from dmxplatform.redis_client import sync_redis

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def version() -> int:
    return int(sync_redis().get(CONTENT_FILTER_VERSION.key) or 0)


def test_actions_are_the_engines_actions():
    assert set(SensitiveTermAction.values) == {a.value for a in FilterAction}


def test_terms_are_unique_ignoring_case():
    sensitive_term_create(term="Bad")
    with pytest.raises(ValidationError, match="exists already"):
        sensitive_term_create(term="bAD")
    with pytest.raises(IntegrityError):
        SensitiveTerm.objects.create(term="BAD")


@pytest.mark.parametrize("term", ["***", "   ", "-_-", "\u200b"])
def test_a_term_with_nothing_to_match_is_refused(term):
    with pytest.raises(ValidationError):
        sensitive_term_create(term=term)
    assert not SensitiveTerm.objects.exists()


def test_an_unknown_action_is_refused():
    with pytest.raises(ValidationError):
        sensitive_term_create(term="bad", action="explode")


def test_the_filter_is_built_from_active_terms_only():
    sensitive_term_create(term="敏感词", category="politics", action=SensitiveTermAction.MASK)
    sensitive_term_create(term="bad")
    sensitive_term_create(term="old", is_active=False)
    content_filter = content_filter_load(version=7)
    assert content_filter.version == 7
    found = {(m.term, m.category, m.action) for m in content_filter.scan("b.a.d old 敏 感 词")}
    assert found == {
        ("bad", "default", FilterAction.BLOCK),
        ("敏感词", "politics", FilterAction.MASK),
    }


def test_creating_a_term_bumps_the_version_once_the_transaction_commits(
    django_capture_on_commit_callbacks,
):
    start = version()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        sensitive_term_create(term="bad")
    assert version() == start  # not before the commit: a gateway would reload the old rows
    assert len(callbacks) == 1
    with django_capture_on_commit_callbacks(execute=True):
        sensitive_term_create(term="worse")
    assert version() == start + 1


def test_every_write_bumps_the_version(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        term = sensitive_term_create(term="bad")
    start = version()
    with django_capture_on_commit_callbacks(execute=True):
        term.action = SensitiveTermAction.FLAG
        sensitive_term_update(sensitive_term=term)
    with django_capture_on_commit_callbacks(execute=True):
        sensitive_term_bulk_set_active(queryset=SensitiveTerm.objects.all(), is_active=False)
    with django_capture_on_commit_callbacks(execute=True):
        sensitive_term_delete(sensitive_term=term)
    assert version() == start + 3
    assert not SensitiveTerm.objects.exists()


def test_import_creates_what_is_missing_in_one_go(django_capture_on_commit_callbacks):
    sensitive_term_create(term="Bad")
    start = version()
    with django_capture_on_commit_callbacks(execute=True):
        created = sensitive_term_import(
            terms=["bad", " 敏感词 ", "", "worse", "WORSE"], category="imported"
        )
    assert sorted(t.term for t in created) == ["worse", "敏感词"]
    assert SensitiveTerm.objects.filter(category="imported").count() == 2
    assert version() == start + 1


def test_import_refuses_a_term_with_nothing_to_match():
    with pytest.raises(ValidationError):
        sensitive_term_import(terms=["fine", "***"])
    assert not SensitiveTerm.objects.exists()


def test_adding_a_term_in_the_admin_reloads_the_gateways(
    admin_client, django_capture_on_commit_callbacks
):
    start = version()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/admin/gateway/sensitiveterm/add/",
            {"term": " 机密 ", "category": "secrets", "action": "mask", "is_active": "on"},
        )
    assert response.status_code == 302
    term = SensitiveTerm.objects.get()
    assert (term.term, term.category, term.action, term.is_active) == (
        "机密",
        "secrets",
        "mask",
        True,
    )
    assert version() == start + 1
    assert [m.term for m in content_filter_load().scan("机-密")] == ["机密"]


def test_the_admin_shows_the_unique_error_instead_of_saving(admin_client):
    sensitive_term_create(term="bad")
    response = admin_client.post(
        "/admin/gateway/sensitiveterm/add/",
        {"term": "BAD", "category": "default", "action": "block", "is_active": "on"},
    )
    assert response.status_code == 200
    assert "exists already" in response.content.decode()
    assert SensitiveTerm.objects.count() == 1


def test_editing_and_deleting_in_the_admin_reload_the_gateways(
    admin_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        term = sensitive_term_create(term="bad")
        other = sensitive_term_create(term="worse")
    start = version()
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            f"/admin/gateway/sensitiveterm/{term.pk}/change/",
            {"term": "bad", "category": "abuse", "action": "flag", "is_active": "on"},
        )
    term.refresh_from_db()
    assert (term.category, term.action) == ("abuse", "flag")
    assert version() == start + 1
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            "/admin/gateway/sensitiveterm/",
            {"action": "deactivate", "_selected_action": [term.pk]},
        )
    assert not SensitiveTerm.objects.get(pk=term.pk).is_active
    assert version() == start + 2
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            "/admin/gateway/sensitiveterm/",
            {"action": "delete_selected", "_selected_action": [term.pk, other.pk], "post": "yes"},
        )
    assert not SensitiveTerm.objects.exists()
    assert version() == start + 3


def test_the_admin_list_filters_and_searches(admin_client):
    sensitive_term_create(term="bad", category="abuse")
    sensitive_term_create(term="机密", category="secrets", action=SensitiveTermAction.MASK)
    page = admin_client.get("/admin/gateway/sensitiveterm/", {"action__exact": "mask"})
    assert page.status_code == 200
    assert "机密" in page.content.decode() and ">bad<" not in page.content.decode()
    page = admin_client.get("/admin/gateway/sensitiveterm/", {"q": "bad"})
    assert ">bad<" in page.content.decode() and "机密" not in page.content.decode()
