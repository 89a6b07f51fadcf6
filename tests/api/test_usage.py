"""/api/v1/usage/records and /usage/daily (filters, cursor pages), /quotas and /models."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.billing.counters import period_bounds
from apps.hardware.nodestate import fleet_key
from apps.keys.choices import QuotaPeriod
from apps.keys.models import Plan, PlanQuota
from apps.keys.ratelimit import quota_key
from apps.models.models import LlmModel
from dmxplatform.redis_client import sync_redis
from tests.api.conftest import API, error_of, record_usage
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.routing.factories import make_snapshot

pytestmark = pytest.mark.django_db

HOUR = 3600


def request_ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["request_id"] for row in response.json()["results"]]


@pytest.fixture
def usage(owner):
    """Two keys' requests over three hours: (key a, key b, {name: request id})."""
    a, _ = make_api_key(owner.tenant, name="a")
    b, _ = make_api_key(owner.tenant, name="b")
    now = time.time()
    ids = {
        "a-old": record_usage(a, created_at=now - 3 * HOUR, model="m1"),
        "a-mid": record_usage(a, created_at=now - 2 * HOUR, model="m2", status="upstream_error"),
        "b-new": record_usage(b, created_at=now - HOUR, model="m1"),
    }
    return a, b, ids


def test_records_newest_first_with_their_key(owner, usage):
    _, b, ids = usage
    response = owner.client.get(f"{API}/usage/records")
    assert request_ids(response) == [ids["b-new"], ids["a-mid"], ids["a-old"]]
    first = response.json()["results"][0]
    assert (first["key"], first["model"], first["total_tokens"]) == (b.key_id, "m1", 18)


def test_records_filter_by_time_key_model_and_status(owner, usage):
    a, _, ids = usage
    since = datetime.fromtimestamp(time.time() - 2.5 * HOUR, tz=UTC).isoformat()
    until = datetime.fromtimestamp(time.time() - 1.5 * HOUR, tz=UTC).isoformat()
    records = f"{API}/usage/records"
    get = owner.client.get
    assert request_ids(get(records, {"since": since})) == [ids["b-new"], ids["a-mid"]]
    assert request_ids(get(records, {"until": until})) == [ids["a-mid"], ids["a-old"]]
    assert request_ids(get(records, {"key": a.key_id})) == [ids["a-mid"], ids["a-old"]]
    assert request_ids(get(records, {"model": "m1"})) == [ids["b-new"], ids["a-old"]]
    assert request_ids(get(records, {"status": "upstream_error"})) == [ids["a-mid"]]
    assert request_ids(get(records, {"key": a.key_id, "model": "m1"})) == [ids["a-old"]]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"status": "fine"}, "status"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
    ],
)
def test_bad_filters_and_cursors_are_a_400_naming_them(owner, usage, query, param):
    response = owner.client.get(f"{API}/usage/records", query)
    assert response.status_code == 400 and error_of(response)["param"] == param


def test_moments_are_taken_in_any_offset(owner, usage):
    _, _, ids = usage
    # +16:30 is valid ISO 8601 that PostgreSQL refuses as an offset: it is converted first.
    moment = datetime.fromtimestamp(time.time() - 1.5 * HOUR, tz=UTC) + timedelta(hours=16.5)
    since = moment.replace(tzinfo=None).isoformat() + "+16:30"
    response = owner.client.get(f"{API}/usage/records", {"since": since})
    assert request_ids(response) == [ids["b-new"]]


def test_cursor_pages_walk_every_record_once(owner, usage):
    _, _, ids = usage
    seen, url = [], f"{API}/usage/records?limit=2"
    while url:
        page = owner.client.get(url)
        seen += request_ids(page)
        url = page.json()["next"]
    assert seen == [ids["b-new"], ids["a-mid"], ids["a-old"]]


def test_daily_totals_per_key_model_and_day(owner):
    a, _ = make_api_key(owner.tenant, name="a")
    b, _ = make_api_key(owner.tenant, name="b")
    today = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    yesterday = today - timedelta(days=1)
    for at, key, model in [
        (yesterday, a, "m1"),
        (today, a, "m1"),
        (today, a, "m1"),
        (today, b, "m2"),
    ]:
        record_usage(key, created_at=at.timestamp(), model=model)
    response = owner.client.get(f"{API}/usage/daily")
    assert response.status_code == 200
    results = response.json()["results"]
    rows = {(r["day"], r["key"], r["model"]): (r["requests"], r["total_tokens"]) for r in results}
    day, before = today.date().isoformat(), yesterday.date().isoformat()
    assert rows == {
        (day, a.key_id, "m1"): (2, 36),
        (day, b.key_id, "m2"): (1, 18),
        (before, a.key_id, "m1"): (1, 18),
    }
    assert [r["day"] for r in results] == [day, day, before]  # newest day first
    only = owner.client.get(f"{API}/usage/daily", {"since": day, "key": a.key_id}).json()
    assert [(r["day"], r["requests"]) for r in only["results"]] == [(day, 2)]
    assert owner.client.get(f"{API}/usage/daily", {"until": before}).json()["results"] == []
    bad = owner.client.get(f"{API}/usage/daily", {"since": "2026-02-30"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "since"


def test_quotas_say_what_remains(member):
    plan = Plan.objects.create(name="metered")
    PlanQuota.objects.create(plan=plan, period=QuotaPeriod.MONTH, model="", tokens=1000)
    tenant = member.tenant
    tenant.plan = plan
    tenant.save()
    key, _ = make_api_key(tenant, token_quota=300, token_quota_period=QuotaPeriod.DAY)
    month, _, _ = period_bounds(QuotaPeriod.MONTH, timezone.now())
    sync_redis().set(quota_key(tenant.id, "tenant", tenant.id, month, ""), 250)
    response = member.client.get(f"{API}/quotas")
    assert response.status_code == 200
    found = {(q["scope"], q["period"]): q for q in response.json()}
    assert (found["tenant", "month"]["used"], found["tenant", "month"]["remaining"]) == (250, 750)
    assert found["key", "day"]["key_id"] == key.key_id
    assert (found["key", "day"]["limit"], found["key", "day"]["remaining"]) == (300, 300)


def test_models_lists_active_models_and_whether_a_node_serves_them(member):
    _, version = make_model("api-served", max_context_tokens=4096)
    make_model("api-idle")
    make_model("api-drained")
    retired, _ = make_model("api-retired")
    LlmModel.objects.filter(id=retired.id).update(is_active=False)
    nodes = [
        make_snapshot(model="api-served", version_id=version.id),
        make_snapshot(model="api-drained", drained=True),
        make_snapshot(model="api-idle", status="down"),
    ]
    sync_redis().hset(fleet_key(), mapping={str(n.id): n.encode() for n in nodes})
    response = member.client.get(f"{API}/models")
    assert response.status_code == 200
    found = {m["name"]: m for m in response.json()}
    assert "api-retired" not in found
    assert {name: found[name]["served"] for name in ("api-served", "api-idle", "api-drained")} == {
        "api-served": True,
        "api-idle": False,
        "api-drained": False,
    }
    assert found["api-served"]["context_length"] == 4096


def test_usage_is_read_only_for_everyone(owner):
    for path in ("usage/records", "usage/daily", "quotas", "models"):
        response = owner.client.post(f"{API}/{path}", {}, format="json")
        assert response.status_code == 405, path
        assert error_of(response)["code"] == "method_not_allowed"


def test_stored_responses_usage_counts_the_callers_tenant_only(owner, member, stranger):
    from apps.gateway.models import StoredResponse

    now = timezone.now()
    for tenant, name, size, days in (
        (owner.tenant, "resp_a", 700, 30),
        (owner.tenant, "resp_b", 300, 2),
        (owner.tenant, "resp_old", 10**6, -1),  # past its retention
        (stranger.tenant, "resp_c", 10**6, 30),
    ):
        StoredResponse.objects.create(
            id=name, tenant=tenant, created_at=now, expires_at=now + timedelta(days=days),
            status="completed", model="m", response={"id": name}, size_bytes=size,
        )  # fmt: skip
    response = member.client.get(f"{API}/usage/stored-responses")  # members read
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["count"], body["size_bytes"], body["retention_days"]) == (2, 1000, 30)
    assert body["next_expiry"].startswith((now + timedelta(days=2)).date().isoformat())
