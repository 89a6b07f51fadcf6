"""The usage page (quotas, charts' data, the table by key) and the CSV export of raw records."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from apps.keys.models import PlanQuota
from apps.portal import usage_csv
from tests.keys.factories import make_api_key
from tests.portal.conftest import make_record, table


def _chart_data(html: str) -> dict:
    found = re.search(r'<script id="usage-data" type="application/json">(.*?)</script>', html)
    assert found, "the charts' data is in the page"
    return json.loads(found.group(1))


def test_the_page_shows_the_last_30_days_per_day_model_and_key(owner, stranger, private_redis):
    key, _ = make_api_key(owner.tenant, name="prod")
    other_key, _ = make_api_key(owner.tenant, name="batch")
    now = timezone.now()
    make_record(key, now, model="dmx-tiny", prompt_tokens=10, completion_tokens=5)
    make_record(key, now - timedelta(days=2), model="dmx-tiny-b", prompt_tokens=100)
    make_record(other_key, now, model="dmx-tiny", prompt_tokens=1, completion_tokens=1)
    make_record(key, now - timedelta(days=40))  # outside the window
    foreign, _ = make_api_key(stranger.tenant, name="theirs")
    make_record(foreign, now, prompt_tokens=999)

    response = owner.client.get(reverse("portal:usage"))
    html = response.content.decode()

    data = _chart_data(html)
    assert len(data["days"]) == 30 and data["days"][-1] == now.date().isoformat()
    assert data["requests"][-1] == 2 and data["requests"][-3] == 1 and sum(data["requests"]) == 3
    assert data["tokens_by_model"]["dmx-tiny"][-1] == 17
    assert data["tokens_by_model"]["dmx-tiny-b"][-3] == 105
    assert 'id="requests-chart"' in html and 'id="tokens-chart"' in html
    # The same numbers without JavaScript, and per key, most tokens first.
    assert f'<tr><td>{now.date():%Y-%m-%d}</td><td class="num">2</td>' in html
    by_key = html[html.index('id="usage-by-key"') :]
    assert by_key.index(key.key_id) < by_key.index(other_key.key_id)
    assert ">120</td>" in by_key  # prod: 15 + 105 tokens
    assert foreign.key_id not in html


def test_quotas_show_what_remains(owner, private_redis):
    PlanQuota.objects.create(plan=owner.tenant.plan or _plan(owner), period="day", tokens=5000)
    make_api_key(owner.tenant, token_quota=700, token_quota_period="hour")
    html = owner.client.get(reverse("portal:usage")).content.decode()
    quotas = table(html, "quota-table")
    assert "the whole tenant" in quotas and ">5,000</td>" in quotas
    assert "<strong>5,000</strong>" in quotas and "<strong>700</strong>" in quotas


def _plan(person):
    from apps.keys.models import Plan

    person.tenant.plan = Plan.objects.create(name=f"plan-{person.tenant.slug}")
    person.tenant.save()
    return person.tenant.plan


def _read(response: StreamingHttpResponse) -> list[list[str]]:
    """Read the body as an ASGI server does; the database reads run on this thread (through
    async_to_sync), in the test's transaction."""

    async def body() -> str:
        return "".join([chunk.decode() async for chunk in response.streaming_content])

    return list(csv.reader(io.StringIO(async_to_sync(body)())))


def test_the_export_streams_the_records_of_the_range(owner, stranger, monkeypatch):
    # Two rows per read: the three rows below must come whole across reads.
    monkeypatch.setattr(usage_csv, "CHUNK_ROWS", 2)
    key, _ = make_api_key(owner.tenant, name="prod")
    day = datetime(2025, 3, 10, tzinfo=UTC)
    inside = [
        make_record(key, day + timedelta(hours=1), request_id="req_a"),
        make_record(key, day + timedelta(days=1, hours=23, minutes=59), request_id="req_b"),
        make_record(key, day + timedelta(days=2), request_id="req_c", batch_id="batch_x"),
    ]
    make_record(key, day - timedelta(seconds=1), request_id="req_before")
    make_record(key, day + timedelta(days=3), request_id="req_after")
    foreign, _ = make_api_key(stranger.tenant)
    make_record(foreign, day + timedelta(hours=2), request_id="req_theirs")

    response = owner.client.get(
        reverse("portal:usage_export"), {"since": "2025-03-10", "until": "2025-03-12"}
    )

    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse) and response.is_async
    assert response["Content-Type"] == "text/csv"
    assert "usage-" in response["Content-Disposition"]
    rows = _read(response)
    assert rows[0] == list(usage_csv.COLUMNS)
    assert [row[0] for row in rows[1:]] == [record.request_id for record in inside]
    first = dict(zip(rows[0], rows[1], strict=True))
    assert first["key_id"] == key.key_id and first["key_name"] == "prod"
    assert first["total_tokens"] == "15" and first["created_at"].startswith("2025-03-10T01:00")
    assert first["batch_id"] == "" and rows[3][-1] == "batch_x"


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"since": "2025-03-10"},
        {"since": "yesterday", "until": "2025-03-12"},
        {"since": "2025-03-12", "until": "2025-03-10"},
    ],
)
def test_a_bad_range_is_a_400_with_the_form(owner, query, private_redis):
    response = owner.client.get(reverse("portal:usage_export"), query)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="export-form"' in html and "errorlist" in html


def test_members_export_too(member, private_redis):
    response = member.client.get(
        reverse("portal:usage_export"), {"since": "2025-03-10", "until": "2025-03-10"}
    )
    assert response.status_code == 200
    assert _read(response) == [list(usage_csv.COLUMNS)]
