"""The request trace pages: the search over usage records, and one request's waterfall of stages,
routing decision and usage record; who may see them. Records arrive the way the gateway sends
them: usage and decision events on their streams, drained into the database by the flushes."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.billing.models import UsageRecord
from apps.billing.services import usage_flush
from apps.console.trace import PAGE_SIZE
from apps.routing.decisions import DECISION_STREAM, DecisionEvent
from apps.routing.models import RoutingDecision
from apps.routing.services import decisions_flush
from dmxplatform import streams
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import append_usage, make_api_key, make_tenant, make_usage_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]
SEARCH = "/admin/platform/traces/"

# A streamed request as the gateway times it, written in no particular order (as jsonb keeps
# it): 60.5 ms of stages in a request of 64 ms.
STREAMED = {
    "settle": 0.5,
    "decode": 30.0,
    "auth": 0.25,
    "ttft": 20.5,
    "connect": 5.0,
    "route": 1.0,
    "limits": 1.25,
    "context": 1.0,
    "screen": 0.5,
    "intent": 0.25,
    "parse": 0.25,
}
STREAMED_MS = 64.0


def _staff(role: str | None) -> User:
    user = User.objects.create_user(
        f"{role}-{uuid.uuid4().hex[:6]}", password="pw-long-enough-1", is_staff=True
    )
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def viewer(client):
    client.force_login(_staff("viewer"))
    return client


def record(key, **fields) -> str:
    """Store one request's usage record through the ledger; return its request id."""
    event = make_usage_event(key, **fields)
    append_usage(event)
    assert usage_flush() == 1
    return event.request_id


def decision(request_id: str, **fields) -> None:
    """Store a routing decision through the decision log."""
    event = DecisionEvent(
        request_id=request_id,
        created_at=time.time(),
        requested_model="auto",
        model="m",
        intent="code",
        priority=1,
        outcome="routed",
        chosen_node="gpu-a",
        chosen_version="v2",
        pool="canary",
        fallback=False,
        candidates=[
            {
                "node": "gpu-a",
                "version": "v2",
                "rejected_by": None,
                "scores": {"queue": 0.5, "kv_cache": 0.25},
                "total": 0.91,
            },
            {
                "node": "gpu-b",
                "version": "v1",
                "rejected_by": "temperature",
                "scores": {},
                "total": 0,
            },
        ],
        waited_ms=0.0,
        decision_us=42.5,
    )
    for name, value in fields.items():
        setattr(event, name, value)
    sync_redis().xadd(DECISION_STREAM.shard(0).key(), {streams.FIELD: event.encode()})
    assert decisions_flush() == 1


def stages_shown(html: str) -> list[tuple[str, str, float]]:
    """The waterfall's rows as the page lists them: (stage, layer, ms)."""
    rows = re.findall(r'data-stage="([^"]+)" data-layer="([^"]+)" data-ms="([^"]+)"', html)
    return [(stage, layer, float(ms)) for stage, layer, ms in rows]


def request_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-request-id="([^"]+)"', html)


# --- one request's trace ---------------------------------------------------------------------


def test_a_streamed_request_shows_its_stages_in_pipeline_order_end_to_end(viewer):
    key, _ = make_api_key()
    request_id = record(
        key, stream=True, timings=STREAMED, duration_ms=STREAMED_MS, time_to_first_token_ms=29.0
    )

    page = viewer.get(f"{SEARCH}{request_id}/")

    assert page.status_code == 200
    html = page.content.decode()
    shown = stages_shown(html)
    assert [stage for stage, _, _ in shown] == [
        "auth",
        "parse",
        "intent",
        "screen",
        "context",
        "limits",
        "route",
        "connect",
        "ttft",
        "decode",
        "settle",
        "unaccounted",
    ]
    layers = {stage: layer for stage, layer, _ in shown}
    assert layers["limits"] == "gateway" and layers["route"] == "routing"
    assert layers["connect"] == layers["ttft"] == layers["decode"] == "inference"
    assert {stage: ms for stage, _, ms in shown} == {**STREAMED, "unaccounted": 3.5}
    # Each bar starts where the ones before it end, as a share of the request's 64 ms: decode
    # after 30 ms of stages (46.875%), for 30 ms (46.875%).
    decode_row = re.search(r'data-stage="decode".*?</tr>', html, re.S).group(0)
    assert 'style="left: 46.875%; width: 46.875%"' in decode_row
    assert "30.00 ms" in decode_row  # starts at
    # The slowest is marked, and said at the top.
    assert 'class="wf-row wf-slowest" data-stage="decode"' in html
    assert html.count("wf-slowest") == 1
    assert "slowest: <strong>decode</strong> (inference), 30.0 ms" in html
    unaccounted = re.search(r'data-stage="unaccounted".*?</tr>', html, re.S).group(0)
    assert 'style="left: 94.531%; width: 5.469%"' in unaccounted
    assert "stages 60.50 ms of the request's 64.00 ms" in html
    assert "from the first token to the end of the stream (streamed)" in html


def test_an_unstreamed_request_generates_in_one_piece(viewer):
    key, _ = make_api_key()
    timings = {"generate": 80.0, "connect": 2.0, "settle": 1.0, "auth": 0.5, "route": 0.5}
    request_id = record(key, timings=timings, duration_ms=84.0)

    shown = stages_shown(viewer.get(f"{SEARCH}{request_id}/").content.decode())

    assert [s for s, _, _ in shown] == ["auth", "route", "connect", "generate", "settle"]


def test_a_refused_request_stops_at_the_stage_it_failed_after(viewer):
    key, _ = make_api_key()
    timings = {"auth": 0.2, "parse": 0.1, "intent": 0.1, "screen": 0.3, "context": 0.8}
    request_id = record(
        key,
        status="rejected",
        http_status=429,
        error_code="rate_limit_exceeded",
        prompt_tokens=0,
        completion_tokens=0,
        timings=timings,
        duration_ms=1.5,
    )

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    shown = stages_shown(html)
    assert [s for s, _, _ in shown] == ["auth", "parse", "intent", "screen", "context"]
    assert "HTTP 429 <code>rate_limit_exceeded</code>" in html
    assert "slowest: <strong>context</strong> (gateway)" in html
    # Stages that add up to the duration leave nothing unaccounted.
    assert 'data-stage="unaccounted"' not in html
    # Never routed: no decision was logged.
    assert "Not sampled" in html


def test_the_routing_decision_shows_every_candidate_with_its_verdict_and_scores(viewer):
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS, node="gpu-a")
    decision(request_id)

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    section = re.search(r'<div id="trace-decision">.*?</div>', html, re.S).group(0)
    assert "routed: <strong>gpu-a</strong> (version v2)" in section
    assert "pool: canary" in section
    assert "<td>gpu-a</td>" in section and "<td>eligible</td>" in section
    assert "<code>queue=0.5</code>" in section and "<code>kv_cache=0.25</code>" in section
    assert "<td>gpu-b</td>" in section and "<td>temperature</td>" in section
    assert "decided in 42.5" in section
    assert "Not sampled" not in html


def test_the_intent_confidence_shows_with_the_record_and_the_decision(viewer):
    key, _ = make_api_key()
    request_id = record(
        key, intent="code", intent_confidence=0.4123, intent_low_confidence=True, timings=STREAMED
    )
    decision(request_id, intent_confidence=0.4123, intent_low_confidence=True)
    sure = record(key, intent="math", intent_confidence=0.97, timings=STREAMED)
    unknown = record(key, intent="chat", timings=STREAMED)  # logged before the confidence was

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    shown = re.search(r'<td id="trace-intent">(.*?)</td>', html).group(1)
    assert shown == "code (confidence 0.41, low: routed by the alias's default route)"
    section = re.search(r'<div id="trace-decision">.*?</div>', html, re.S).group(0)
    assert "intent code (confidence 0.41, low: the alias's default route)" in section
    html = viewer.get(f"{SEARCH}{sure}/").content.decode()
    assert re.search(r'<td id="trace-intent">(.*?)</td>', html).group(1) == "math (confidence 0.97)"
    html = viewer.get(f"{SEARCH}{unknown}/").content.decode()
    assert re.search(r'<td id="trace-intent">(.*?)</td>', html).group(1) == "chat"


def test_a_decision_the_log_did_not_sample_says_so(viewer):
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS)
    decision(f"req_{uuid.uuid4().hex}")  # another request's

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    assert "Not sampled" in html and "pool:" not in html


def test_the_usage_record_and_its_spans_in_the_tracing_ui(viewer, settings):
    settings.DMX_TRACE_URL = "http://jaeger:16686/trace/{trace_id}"
    key, _ = make_api_key()
    trace_id = uuid.uuid4().hex
    request_id = record(
        key,
        timings=STREAMED,
        duration_ms=STREAMED_MS,
        client_request_id="order-7731",
        trace_id=trace_id,
        prompt_tokens=12,
        completion_tokens=30,
    )

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    assert f'href="http://jaeger:16686/trace/{trace_id}"' in html
    assert "order-7731" in html and key.display_prefix in html
    assert "12 prompt + 30 completion = 42" in html


def test_a_tracing_url_with_other_braces_takes_the_trace_id_quoted(viewer, settings):
    # Grafana's Explore links carry JSON in the query; only {trace_id} is a placeholder.
    settings.DMX_TRACE_URL = 'http://grafana:3000/explore?left={"queries":[{"query":"{trace_id}"}]}'
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS, trace_id="ab cd/ef&1")

    page = viewer.get(f"{SEARCH}{request_id}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "{&quot;queries&quot;:[{&quot;query&quot;:&quot;ab%20cd%2Fef%261&quot;}]}" in html


def test_a_trace_id_without_a_tracing_ui_is_shown_unlinked(viewer, settings):
    settings.DMX_TRACE_URL = ""
    key, _ = make_api_key()
    trace_id = uuid.uuid4().hex
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS, trace_id=trace_id)

    html = viewer.get(f"{SEARCH}{request_id}/").content.decode()

    assert f"Trace <code>{trace_id}</code> (set <code>DMX_TRACE_URL</code>" in html
    assert "16686" not in html


def test_an_unknown_request_id_is_not_found(viewer):
    assert viewer.get(f"{SEARCH}req_{uuid.uuid4().hex}/").status_code == 404


# --- search --------------------------------------------------------------------------------


@pytest.fixture
def requests_of_two_tenants():
    """Five requests, newest first: a, b, c of one tenant's two keys, d, e of another's."""
    acme = make_tenant(name="Acme Labs")
    other = make_tenant()
    key_a, _ = make_api_key(acme)
    key_b, _ = make_api_key(acme)
    key_c, _ = make_api_key(other)
    now = time.time()
    slow_route = {**STREAMED, "route": 50.0}
    ids = {
        "a": record(key_a, created_at=now - 10, timings=STREAMED, duration_ms=STREAMED_MS),
        "b": record(key_a, created_at=now - 20, model="big", timings=slow_route, duration_ms=99.0),
        "c": record(
            key_b,
            created_at=now - 3600,
            status="rejected",
            http_status=429,
            timings={"auth": 0.2},
            duration_ms=0.3,
            client_request_id="client-42",
        ),
        "d": record(key_c, created_at=now - 7200, timings=STREAMED, duration_ms=STREAMED_MS),
        "e": record(key_c, created_at=now - 86400, model="big", status="upstream_error"),
    }
    return acme, key_a, ids, now


def _since(moment: float, ago: timedelta) -> str:
    return (datetime.fromtimestamp(moment, tz=UTC) - ago).strftime("%Y-%m-%dT%H:%M")


def test_everything_newest_first_with_duration_and_slowest_stage(viewer, requests_of_two_tenants):
    _, _, ids, now = requests_of_two_tenants

    html = viewer.get(SEARCH, {"since": _since(now, timedelta(days=2))}).content.decode()

    assert request_ids(html) == [ids[n] for n in "abcde"]
    assert 'id="trace-default-range"' not in html
    row_b = re.search(rf'data-request-id="{ids["b"]}".*?</tr>', html, re.S).group(0)
    assert "99.0 ms" in row_b
    assert "route 50.0 ms" in row_b  # the slowest of b's stages
    assert f'href="/admin/platform/traces/{ids["b"]}/"' in row_b


def test_without_criteria_the_last_hour_and_the_page_says_so(viewer, requests_of_two_tenants):
    _, _, ids, _ = requests_of_two_tenants

    for query in ({}, {"status": "", "page": "1"}):
        html = viewer.get(SEARCH, query).content.decode()

        # c is an hour old by the time the page is asked for, d and e older still.
        assert request_ids(html) == [ids["a"], ids["b"]], query
        assert "No criteria given: the last hour's" in html
        assert "2 requests" in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"tenant": "acme labs"}, "abc"),
        ({"model": "big"}, "be"),
        ({"status": "rejected"}, "c"),
        ({"client_request_id": "client-42"}, "c"),
        ({"model": "big", "status": "upstream_error"}, "e"),
    ],
)
def test_search_filters(viewer, requests_of_two_tenants, query, expected):
    _, _, ids, _ = requests_of_two_tenants

    html = viewer.get(SEARCH, query).content.decode()

    assert request_ids(html) == [ids[n] for n in expected]


def test_a_key_is_found_by_the_prefix_shown_for_it(viewer, requests_of_two_tenants):
    _, key_a, ids, _ = requests_of_two_tenants

    for prefix in (key_a.display_prefix, f"sk-dmx-{key_a.key_id}", key_a.key_id[:6]):
        html = viewer.get(SEARCH, {"key_prefix": prefix}).content.decode()
        assert request_ids(html)[:2] == [ids["a"], ids["b"]], prefix


def test_a_time_range(viewer, requests_of_two_tenants):
    _, _, ids, now = requests_of_two_tenants
    since = _since(now, timedelta(hours=1, minutes=30))
    until = _since(now, timedelta(minutes=30))

    html = viewer.get(SEARCH, {"since": since, "until": until}).content.decode()

    assert request_ids(html) == [ids["c"]]


def test_a_request_id_goes_straight_to_its_trace(viewer, requests_of_two_tenants):
    _, _, ids, _ = requests_of_two_tenants

    found = viewer.get(SEARCH, {"request_id": ids["d"]})
    missing = viewer.get(SEARCH, {"request_id": "req_nothing"})

    assert found.status_code == 302 and found["Location"] == f"{SEARCH}{ids['d']}/"
    assert missing.status_code == 200 and "No request matches." in missing.content.decode()


def test_results_are_paginated_without_counting(viewer):
    key, _ = make_api_key()
    now = time.time()
    events = [
        make_usage_event(key, created_at=now - n, timings={"auth": 0.1})
        for n in range(PAGE_SIZE + 1)
    ]
    append_usage(*events)
    assert usage_flush() == PAGE_SIZE + 1
    query = {"key_prefix": key.key_id}

    with CaptureQueriesContext(connection) as queries:
        first = viewer.get(SEARCH, query).content.decode()
    second = viewer.get(SEARCH, {**query, "page": 2}).content.decode()
    past_the_end = viewer.get(SEARCH, {**query, "page": 3}).content.decode()
    not_a_number = viewer.get(SEARCH, {**query, "page": "x"}).content.decode()

    assert not [q for q in queries if "COUNT(" in q["sql"].upper()]
    assert request_ids(first) == [e.request_id for e in events[:PAGE_SIZE]]
    assert f"{PAGE_SIZE} requests, and older ones" in first
    assert "page 1" in first and f"?key_prefix={key.key_id}&amp;page=2" in first
    assert "newer" not in first
    assert request_ids(second) == [events[-1].request_id]
    assert "1 request on page 2" in second and "older &rsaquo;" not in second
    assert f"?key_prefix={key.key_id}&amp;page=1" in second
    assert request_ids(past_the_end) == [] and "No request matches." in past_the_end
    assert request_ids(not_a_number) == request_ids(first)


def test_a_bad_time_is_an_error_on_the_form(viewer):
    html = viewer.get(SEARCH, {"since": "yesterday-ish"}).content.decode()
    assert "Enter a valid date/time." in html and 'id="trace-results"' not in html


# --- who may see it, and where it is linked from ------------------------------------------------


def test_anonymous_users_get_the_admin_login(client):
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS)

    for url in (SEARCH, f"{SEARCH}{request_id}/"):
        page = client.get(url)
        assert page.status_code == 302 and page["Location"].startswith("/admin/login/?next=")


def test_staff_without_the_view_permission_are_refused(client):
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS)
    client.force_login(_staff(None))

    assert client.get(SEARCH).status_code == 403
    assert client.get(f"{SEARCH}{request_id}/").status_code == 403


def test_viewers_and_operators_find_it_in_the_platform_section(client):
    for role in ("viewer", "operator"):
        client.force_login(_staff(role))
        index = client.get("/admin/").content.decode()
        assert f'href="{SEARCH}"' in index and "Request traces" in index
        assert client.get(SEARCH).status_code == 200


def test_the_usage_record_and_the_decision_admin_link_to_the_trace(admin_client):
    key, _ = make_api_key()
    request_id = record(key, timings=STREAMED, duration_ms=STREAMED_MS)
    decision(request_id)
    usage_pk = UsageRecord.objects.get(request_id=request_id).pk
    decision_pk = RoutingDecision.objects.get(request_id=request_id).pk

    for url in (
        f"/admin/billing/usagerecord/{usage_pk}/change/",
        f"/admin/routing/routingdecision/{decision_pk}/change/",
    ):
        html = admin_client.get(url).content.decode()
        assert f'href="{SEARCH}{request_id}/"' in html, url


def test_the_usage_record_and_the_decision_admin_show_the_intent_confidence(admin_client):
    key, _ = make_api_key()
    request_id = record(key, intent="code", intent_confidence=0.4123, intent_low_confidence=True)
    decision(request_id, intent_confidence=0.4123, intent_low_confidence=True)
    usage_pk = UsageRecord.objects.get(request_id=request_id).pk
    decision_pk = RoutingDecision.objects.get(request_id=request_id).pk

    for page in ("usagerecord", "routingdecision"):
        app = "billing" if page == "usagerecord" else "routing"
        listed = admin_client.get(f"/admin/{app}/{page}/?intent_low_confidence__exact=1")
        assert "column-intent_confidence" in listed.content.decode(), page
        assert request_id in listed.content.decode(), page
        pk = usage_pk if page == "usagerecord" else decision_pk
        html = admin_client.get(f"/admin/{app}/{page}/{pk}/change/").content.decode()
        assert "Intent confidence" in html and "0.4123" in html, page
        assert "Intent low confidence" in html, page
