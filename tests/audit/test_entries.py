"""What the log keeps and leaves out beyond the console and the API: bulk imports get their
entries; machines' chatter (heartbeats, the fleet sync, re-registration) gets none."""

from __future__ import annotations

import pytest
from auditlog.cid import correlation_id
from auditlog.context import set_actor
from auditlog.diff import model_instance_diff
from auditlog.models import LogEntry
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.gateway.models import SensitiveTerm
from apps.gateway.services import sensitive_term_import
from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.keys.services import management_token_authenticate
from apps.models.models import Tokenizer
from dmxplatform.audit.entries import acting, audited_update
from tests.api.conftest import as_caller
from tests.audit.conftest import last_entry
from tests.keys.factories import make_member, make_tenant

pytestmark = pytest.mark.django_db

CREATE, UPDATE = LogEntry.Action.CREATE, LogEntry.Action.UPDATE


def test_a_bulk_import_logs_each_new_term():
    operator = User.objects.create_user("importer", password="pw-long-enough-1")
    with set_actor(operator):
        created = sensitive_term_import(terms=["gamma-term", "Delta-Term", "gamma-term"])
    assert len(created) == 2
    for term in created:
        entry = last_entry(term, CREATE)
        assert entry.actor == operator
        assert entry.changes["term"] == [None, term.term]
        assert entry.changes["is_active"] == [None, True]


def test_a_nodes_live_state_is_not_logged(node):
    node.status = NodeStatus.DOWN
    node.last_heartbeat_at = timezone.now()
    node.num_requests_waiting = 7
    node.kv_cache_usage = 0.5
    node.resources = {"gpus": []}
    node.save()
    assert not LogEntry.objects.get_for_object(node).filter(action=UPDATE).exists()
    # An operator's change to the same row is.
    node.profile = None
    node.drained = True
    node.save()
    assert last_entry(node).changes == {"drained": [False, True]}


def test_a_tokens_use_is_not_logged():
    caller = as_caller(make_member(make_tenant()))
    updates = LogEntry.objects.get_for_object(caller.token).filter(action=UPDATE)
    assert management_token_authenticate(plaintext=caller.secret) is not None
    assert not updates.exists()
    caller.token.refresh_from_db()
    assert caller.token.last_used_at is not None  # it was written, just not logged
    caller.token.last_used_at = None
    caller.token.save()
    assert not updates.exists()


def test_a_node_created_by_its_worker_is_logged_without_an_actor(node):
    entry = last_entry(node, CREATE)
    assert entry.actor is None and entry.changes["name"] == [None, node.name]
    assert "last_heartbeat_at" not in entry.changes and "status" not in entry.changes
    assert Node.objects.filter(id=node.id).exists()


def test_a_tokenizers_deletion_is_logged_without_its_json():
    tokenizer = Tokenizer.objects.create(
        sha256="ab" * 32, tokenizer_json='{"big": 1}', eos_token="</s>"
    )
    tokenizer.delete()
    entry = LogEntry.objects.get(object_pk="ab" * 32, action=LogEntry.Action.DELETE)
    assert entry.changes["eos_token"] == ["</s>", None]
    assert "tokenizer_json" not in entry.changes


# What log_create fills besides the row's id and the time it is written.
ENTRY_FIELDS = [
    "content_type_id",
    "object_pk",
    "object_id",
    "object_repr",
    "serialized_data",
    "action",
    "changes_text",
    "changes",
    "actor_id",
    "actor_email",
    "cid",
    "remote_addr",
    "remote_port",
    "additional_data",
]


def entry_fields(entry: LogEntry) -> dict:
    return {name: getattr(entry, name) for name in ENTRY_FIELDS}


@pytest.fixture
def correlated():
    """A correlation id, as auditlog's middleware sets one from a request's header."""
    token = correlation_id.set("cid-import-1")
    yield "cid-import-1"
    correlation_id.reset(token)


def entry_inserts(queries: CaptureQueriesContext) -> int:
    table = LogEntry._meta.db_table
    return sum(q["sql"].startswith(f'INSERT INTO "{table}"') for q in queries.captured_queries)


def test_a_bulk_imports_entries_are_those_a_save_makes_in_one_insert(correlated):
    operator = User.objects.create_user("bulk-importer", email="bulk@example.com")
    with (
        set_actor(operator, remote_addr="192.0.2.10", remote_port=5000),
        acting(actor=operator, additional_data={"management_token": "t-1"}),
    ):
        with CaptureQueriesContext(connection) as queries:
            created = sensitive_term_import(terms=["one-term", "two-term", "three-term"])
        assert entry_inserts(queries) == 1
        # What log_create (auditlog's signals) would have made for one of them.
        expected = LogEntry.objects.log_create(
            created[0],
            action=CREATE,
            changes=model_instance_diff(None, created[0], use_json_for_changes=True),
        )
    expected.refresh_from_db()  # as stored, as the entry compared with it is
    entry = LogEntry.objects.get_for_object(created[0]).exclude(id=expected.id).get()
    assert entry_fields(entry) == entry_fields(expected)
    assert entry.actor_email == "bulk@example.com" and entry.cid == correlated
    assert entry.remote_addr == "192.0.2.10" and entry.timestamp is not None
    assert entry.additional_data == {"management_token": "t-1"}
    assert all(last_entry(term, CREATE).actor == operator for term in created)


def test_an_audited_update_logs_its_rows_in_one_insert(correlated):
    operator = User.objects.create_user("bulk-updater")
    terms = sensitive_term_import(terms=["up-one", "up-two", "up-three"])
    with set_actor(operator, remote_addr="192.0.2.11"), CaptureQueriesContext(connection) as q:
        assert audited_update(SensitiveTerm.objects.filter(term__startswith="up-"), action="flag")
    assert entry_inserts(q) == 1
    for term in terms:
        entry = last_entry(term)
        assert entry.changes == {"action": ["block", "flag"]}
        assert (entry.actor, entry.remote_addr, entry.cid) == (operator, "192.0.2.11", correlated)
