"""Batches where people look at them: a developer's in the portal (their tenant's only, with
their files), an operator's in the console (every tenant's, with the nodes that ran them, and a
cancel a viewer cannot run)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.batches.choices import BatchStatus
from apps.batches.models import Batch
from apps.keys.choices import MemberRole
from tests.batches.factories import finished_batch
from tests.keys.factories import make_api_key, make_member, make_staff, make_tenant
from tests.portal.conftest import make_record, sign_in

pytestmark = pytest.mark.django_db


def test_a_member_sees_the_tenants_batches_and_downloads_their_files_and_no_one_elses():
    tenant = make_tenant()
    person = sign_in(make_member(tenant, role=MemberRole.MEMBER))
    key, _ = make_api_key(tenant)
    batch = finished_batch(key)
    make_record(key, timezone.now(), batch_id=batch.id, node="node-1", cost=Decimal("0.0005"))
    other = finished_batch(make_api_key(make_tenant())[0])

    page = person.client.get("/batches/").content.decode()
    assert batch.id in page and other.id not in page
    assert 'data-cost="0.000500"' in page
    download = person.client.get(f"/batches/files/{batch.output_file_id}")
    assert download.status_code == 200
    assert json.loads(b"".join(download.streaming_content))["custom_id"] == "a"
    assert person.client.get(f"/batches/files/{other.output_file_id}").status_code == 404
    assert Client().get("/batches/").status_code == 302  # signed out: to the sign-in page


def test_operators_see_every_batch_with_its_nodes_and_cancel_viewers_only_look():
    key, _ = make_api_key()
    running = finished_batch(key)
    Batch.objects.filter(id=running.id).update(status=BatchStatus.IN_PROGRESS)
    make_record(key, timezone.now(), batch_id=running.id, node="node-7")
    viewer, operator = Client(), Client()
    viewer.force_login(make_staff("viewer"))
    operator.force_login(make_staff("operator"))

    listed = viewer.get("/admin/batches/batch/").content.decode()
    assert running.id in listed and 'value="cancel"' not in listed
    # The admin's own links quote the id (its "_" is the admin's escape character).
    detail = viewer.get(reverse("admin:batches_batch_change", args=[quote(running.id)]))
    assert detail.status_code == 200
    detail = detail.content.decode()
    assert "node-7: 1 requests (100%)" in detail
    viewer.post("/admin/batches/batch/", {"action": "cancel", "_selected_action": [running.id]})
    assert Batch.objects.get(id=running.id).status == BatchStatus.IN_PROGRESS

    assert 'value="cancel"' in operator.get("/admin/batches/batch/").content.decode()
    operator.post("/admin/batches/batch/", {"action": "cancel", "_selected_action": [running.id]})
    assert Batch.objects.get(id=running.id).status == BatchStatus.CANCELLING
