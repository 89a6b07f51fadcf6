"""The address an entry names is the caller's: X-Forwarded-For counts from a trusted proxy
only, and then only its nearest hop that is not a proxy (clients can write the rest)."""

from __future__ import annotations

import pytest
from auditlog.models import LogEntry

from apps.gateway.models import SensitiveTerm
from apps.gateway.services import sensitive_term_create
from tests.audit.conftest import last_entry
from tests.keys.factories import make_staff

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gateway/sensitiveterm/"
PROXY = "10.0.0.5"
CLIENT = "203.0.113.9"
FORGED = "198.51.100.1"


@pytest.fixture(autouse=True)
def _behind_a_proxy(settings):
    settings.DMX_TRUSTED_PROXIES = ["10.0.0.0/8"]


@pytest.fixture
def operator(client):
    client.force_login(make_staff("operator"))
    return client


def add_term(client, term: str, **headers) -> LogEntry:
    """Add a term in the admin (a save, logged by auditlog's signals); its entry."""
    response = client.post(
        f"{CHANGELIST}add/",
        {"term": term, "category": "default", "action": "block", "is_active": "on"},
        **headers,
    )
    assert response.status_code == 302, response.content.decode()[:500]
    return last_entry(SensitiveTerm.objects.get(term=term), LogEntry.Action.CREATE)


def test_a_forged_forwarded_for_from_an_untrusted_peer_is_not_recorded(operator):
    entry = add_term(
        operator,
        "forged-term",
        REMOTE_ADDR=CLIENT,
        HTTP_X_FORWARDED_FOR=FORGED,
        HTTP_X_FORWARDED_PORT="4444",
    )
    assert entry.remote_addr == CLIENT
    assert entry.remote_port is None


def test_behind_a_trusted_proxy_the_clients_address_is_recorded(operator):
    entry = add_term(
        operator,
        "proxied-term",
        REMOTE_ADDR=PROXY,
        # The client wrote the first hop; the proxies appended the others.
        HTTP_X_FORWARDED_FOR=f"{FORGED}, {CLIENT}, 10.0.0.7",
        HTTP_X_FORWARDED_PORT="4444",
    )
    assert entry.remote_addr == CLIENT
    assert entry.remote_port == 4444


def test_without_trusted_proxies_the_header_is_ignored(operator, settings):
    settings.DMX_TRUSTED_PROXIES = []
    entry = add_term(operator, "direct-term", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=FORGED)
    assert entry.remote_addr == PROXY


def test_a_hop_that_is_no_address_is_recorded_as_none_not_a_server_error(operator):
    entry = add_term(operator, "odd-term", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="unknown")
    assert entry.remote_addr is None


def test_entries_of_a_bulk_change_get_the_same_address(operator):
    term = sensitive_term_create(term="bulk-term")
    response = operator.post(
        CHANGELIST,
        {"action": "deactivate", "_selected_action": [str(term.pk)]},
        REMOTE_ADDR=CLIENT,
        HTTP_X_FORWARDED_FOR=FORGED,
    )
    assert response.status_code == 302
    entry = last_entry(term)
    assert entry.changes == {"is_active": [True, False]} and entry.remote_addr == CLIENT
