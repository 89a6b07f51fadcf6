"""Stored responses' records, pages and drain, without a running platform (the e2e side is
test_stored_responses.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.gateway.models import StoredResponse
from apps.gateway.response_records import RESPONSES_STREAM, ResponseRecord, input_items
from apps.gateway.selectors import stored_response_get, stored_responses_usage
from apps.gateway.services import (
    stored_response_delete,
    stored_responses_flush,
    stored_responses_purge,
)
from apps.gateway.stored import ResponseStore, input_item_page
from dmxplatform import streams
from dmxplatform.errors import InvalidRequestError
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_tenant


def record(response_id: str, tenant_id: int = 1, *, status="completed", created_at=None, items=3):
    return ResponseRecord(
        tenant_id=tenant_id,
        api_key_id=5,
        created_at=time.time() if created_at is None else created_at,
        response={"id": response_id, "object": "response", "status": status, "output": [],
                  "model": "m", "background": status != "completed"},
        input_items=[{"id": f"msg_{n}", "type": "message"} for n in range(items)],
    )  # fmt: skip


def test_input_items_get_ids_and_content_parts_and_keep_earlier_ones():
    items = input_items(
        [
            {"id": "msg_old", "type": "message", "role": "user", "content": [], "status": "x"},
            {"role": "assistant", "content": "Hi."},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "req_abc",
    )
    assert [item["id"] for item in items] == ["msg_old", "msg_abc_in1", "fco_abc_in2"]
    assert items[1]["content"] == [{"type": "output_text", "text": "Hi."}]
    assert items[1]["type"] == "message" and items[1]["status"] == "completed"
    assert items[0]["status"] == "x"


def test_input_items_page_as_openai_pages_them():
    stored = record("resp_1", items=5)
    first = input_item_page(stored, {"limit": "2"})  # newest first by default
    assert [item["id"] for item in first["data"]] == ["msg_4", "msg_3"]
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("msg_4", "msg_3", True)
    rest = input_item_page(stored, {"limit": "2", "after": "msg_3"})
    assert [item["id"] for item in rest["data"]] == ["msg_2", "msg_1"]
    last = input_item_page(stored, {"order": "asc", "after": "msg_3"})
    assert [item["id"] for item in last["data"]] == ["msg_4"] and not last["has_more"]


@pytest.mark.parametrize(
    ("query", "param"),
    [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
     ({"limit": "²"}, "limit"), ({"limit": "٣"}, "limit"),
     ({"order": "up"}, "order"), ({"after": "msg_none"}, "after")],
)  # fmt: skip
def test_a_bad_page_query_is_a_400_naming_it(query, param):
    with pytest.raises(InvalidRequestError) as raised:
        input_item_page(record("resp_1"), query)
    assert raised.value.param == param


def test_a_run_left_unfinished_reads_failed_once_no_process_could_run_it(settings):
    settings.DMX_REQUEST_TIMEOUT_SECONDS = 10
    started = time.time()
    running = record("resp_1", status="in_progress", created_at=started)
    assert running.as_of(started + 60).status == "in_progress"  # within timeout + margin
    dead = running.as_of(started + 10 + 61)
    assert dead.status == "failed" and dead.response["error"]["code"] == "server_error"
    finished = record("resp_2", created_at=started)
    assert finished.as_of(started + 10**6).status == "completed"


@pytest.mark.django_db
@pytest.mark.usefixtures("private_redis")
def test_the_drain_stores_each_record_once_and_never_one_deleted_before_it():
    tenant = make_tenant()
    kept, deleted = record("resp_kept", tenant.id), record("resp_deleted", tenant.id)
    gone_tenant = record("resp_orphan", 10**9)  # its tenant was deleted meanwhile
    stored_response_delete(record=deleted)  # deleted while its entry waited in the stream
    client = sync_redis()
    for entry in (kept, kept, deleted, gone_tenant):  # redelivered: stored once
        stream = RESPONSES_STREAM.of_tenant(entry.tenant_id).key()
        client.xadd(stream, {streams.FIELD: entry.encode()})
    assert stored_responses_flush() == 4
    row = StoredResponse.objects.get(deleted_at__isnull=True)
    assert row.id == "resp_kept" and row.tenant_id == tenant.id and row.size_bytes > 0
    assert row.input_items == kept.input_items and row.status == "completed"
    assert row.expires_at - row.created_at == timedelta(days=30)
    marker = StoredResponse.objects.get(id="resp_deleted")
    assert (marker.response, marker.input_items, marker.size_bytes) == ({}, [], 0)
    assert stored_response_get(response_id="resp_deleted", tenant_id=tenant.id) is None
    read, size = stored_response_get(response_id="resp_kept", tenant_id=tenant.id)
    assert (read.response, read.input_items, size) == (
        kept.response,
        kept.input_items,
        len(kept.encode()),
    )
    assert read.created_at == pytest.approx(kept.created_at, abs=1e-6)


@pytest.mark.django_db
def test_deleting_a_stored_row_empties_it_and_hides_it():
    tenant = make_tenant()
    stored = record("resp_x", tenant.id)
    StoredResponse.objects.create(
        id=stored.id, tenant=tenant, created_at=timezone.now(),
        expires_at=timezone.now() + timedelta(days=1), status="completed", model="m",
        response=stored.response, input_items=stored.input_items, size_bytes=900,
    )  # fmt: skip
    assert stored_responses_usage(tenant_id=tenant.id).count == 1
    stored_response_delete(record=stored)
    row = StoredResponse.objects.get(id="resp_x")
    assert row.deleted_at is not None and (row.response, row.size_bytes) == ({}, 0)
    assert stored_response_get(response_id="resp_x", tenant_id=tenant.id) is None
    assert stored_responses_usage(tenant_id=tenant.id).count == 0


@pytest.mark.django_db
def test_the_purge_deletes_responses_past_their_retention():
    tenant = make_tenant()
    now = timezone.now()
    for name, expires in (
        ("resp_old", now - timedelta(seconds=1)),
        ("resp_new", now + timedelta(days=1)),
    ):
        StoredResponse.objects.create(
            id=name, tenant=tenant, created_at=now, expires_at=expires, status="completed",
            model="m", response={"id": name},
        )  # fmt: skip
    assert stored_responses_purge(now=now) == 1
    assert list(StoredResponse.objects.values_list("id", flat=True)) == ["resp_new"]


@pytest.mark.parametrize("response_id", ["resp_\x00", "resp_" + "a" * 60, "msg_1", "resp_a b"])
def test_an_id_no_response_can_have_is_found_without_asking_anything(response_id):
    store = ResponseStore(redis=None)  # asking Redis or the database would fail
    assert asyncio.run(store.get(response_id, 1)) is None
