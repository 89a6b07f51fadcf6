"""Rate limits, concurrency and quotas through two real gateway replicas, and exact billing."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse

from apps.billing.models import UsageRecord
from apps.keys.ratelimit import rules_for
from apps.keys.selectors import key_record_load
from dmxplatform.redis_client import sync_redis
from tests.conftest import BROKEN_MODEL, SERVED_MODELS, wait_for_refresh
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

MODEL = SERVED_MODELS[0]


def body(max_tokens: int = 2, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def chat(api_url: str, key: str, payload: dict):
    return call("POST", api_url + "/chat/completions", key=key, json_body=payload)


def test_requests_per_minute_hold_across_replicas(platform, committed):
    _, secret = make_api_key(requests_per_minute=4)
    a, b = platform.api_urls
    replies = [chat(url, secret, body()) for url in (a, b, a, b)]
    assert [r.status for r in replies] == [200, 200, 200, 200]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in replies] == ["3", "2", "1", "0"]
    assert all(r.headers["x-ratelimit-limit-requests"] == "4" for r in replies)
    refused = chat(b, secret, body())
    assert refused.status == 429
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
    assert 1 <= int(refused.headers["retry-after"]) <= 15  # one request per 15 s comes back


def test_a_request_larger_than_the_token_limit_is_refused_without_retry_hope(platform, committed):
    _, secret = make_api_key(tokens_per_minute=100)
    reply = chat(platform.api_url, secret, body(max_tokens=500))
    assert reply.status == 429
    error = reply.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "tokens")
    assert "Request too large" in error["message"]
    assert "retry-after" in reply.headers


def test_token_quota_exhaustion_is_insufficient_quota(platform, committed):
    _, secret = make_api_key(token_quota=60, token_quota_period="day")
    first = chat(platform.api_url, secret, body(max_tokens=5))
    assert first.status == 200
    used = first.json()["usage"]["total_tokens"]
    reply = chat(platform.api_url, secret, body(max_tokens=60 - used))  # one token too many
    assert reply.status == 429
    assert reply.json()["error"]["code"] == "insufficient_quota"
    assert reply.json()["error"]["type"] == "insufficient_quota"
    assert int(reply.headers["retry-after"]) > 0


def _open_stream(
    api_url: str, key: str, payload: dict
) -> tuple[http.client.HTTPConnection, object]:
    parts = urllib.parse.urlsplit(api_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    connection.request(
        "POST",
        parts.path + "/chat/completions",
        body=json.dumps(payload),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    return connection, response


def test_concurrency_is_shared_across_replicas(platform, committed):
    _, secret = make_api_key(max_concurrent_requests=1)
    a, b = platform.api_urls
    # Long enough that the engine cannot finish it before the second request, even when it
    # delivers a completion in one burst on busy cores (400 tokens once did).
    connection, response = _open_stream(a, secret, body(max_tokens=1500, stream=True))
    response.readline()  # the stream is under way and holds the only slot
    refused = chat(b, secret, body())
    assert refused.status == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    # Leave instead of waiting for 1500 tokens: the gateway settles the request and frees the
    # slot as soon as it sees the client go.
    response.close()
    connection.close()
    wait_for(
        lambda: chat(b, secret, body()).status == 200,
        timeout=10,
        what="the slot to be freed for the key's next request",
    )


def quota_used(key_id: str) -> int:
    """Tokens charged to the key's day quota, read from Redis."""
    record = key_record_load(key_id)
    (rule,) = [r for r in rules_for(record, model=MODEL) if r.meter == "quota"]
    return int(sync_redis().get(rule.key) or 0)


def test_billing_is_exact_for_a_finished_request(platform, committed):
    key, secret = make_api_key(token_quota=10**9, token_quota_period="day")
    reply = chat(platform.api_url, secret, body(max_tokens=9))
    usage = reply.json()["usage"]
    # Reserved prompt + 9, refunded to what vLLM reports: the quota holds exactly that.
    assert quota_used(key.key_id) == usage["prompt_tokens"] + usage["completion_tokens"]


def lease_admissions(gateway_url: str) -> float:
    """The gateway process's count of requests admitted from its lease (/metrics)."""
    text = call("GET", gateway_url + "/metrics").body.decode()
    match = re.search(r'^dmx_gateway_admissions_total\{via="lease"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_busy_keys_quota_is_exact_once_its_leases_are_given_back(platform, committed):
    """A busy key is admitted from leases (apps/keys/leases.py), which count against its quota
    while held; once they expire and go back, the quota holds exactly what was used."""
    key, secret = make_api_key(token_quota=10**9, token_quota_period="day")
    before = lease_admissions(platform.url)
    replies = [chat(platform.api_url, secret, body(max_tokens=1)) for _ in range(6)]
    assert [r.status for r in replies] == [200] * 6
    # The first marks the key busy, the second brings a lease; the rest need no round trip
    # (unless two cores held a request back past the lease's second).
    assert lease_admissions(platform.url) > before
    used = sum(r.json()["usage"]["total_tokens"] for r in replies)
    wait_for(
        lambda: quota_used(key.key_id) == used,
        timeout=10,
        what=f"the quota to come back to the {used} tokens used",
    )


def test_client_disconnect_charges_what_was_generated(platform, committed):
    key, secret = make_api_key(token_quota=10**9, token_quota_period="day")
    connection, response = _open_stream(
        platform.api_url, secret, body(max_tokens=1500, stream=True)
    )
    request_id = response.getheader("x-request-id")
    first = response.readline()  # the first event: the engine is generating
    # Leave at once, as a client does: close the socket. Reading further first would race the
    # engine, which on two busy cores can deliver the rest of its 1500 tokens in one burst (seen:
    # the second line 4.5 s after the first, with [DONE] right behind it). Shutting the socket
    # down while the response still holds it open would leave a half-open peer instead, whose
    # full receive window stalls the gateway's writes and the disconnect it would see.
    response.close()
    connection.close()
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=20,
        what="the disconnected request's usage",
    )
    seen = (first[:80], record.status, record.completion_tokens, record.duration_ms)
    assert record.status == "client_disconnected", seen
    assert record.prompt_tokens > 0 and record.completion_tokens < 1500, seen
    # Charged exactly what the engine reported generating when the client left.
    assert quota_used(key.key_id) == record.prompt_tokens + record.completion_tokens


def test_upstream_failure_before_the_first_token_refunds_everything(platform, committed):
    """A node that refuses connections, the model's only one: 503 with Retry-After (no node
    can serve it now), and it costs nothing."""
    from tests.stack import free_port

    key, secret = make_api_key(token_quota=10**9, token_quota_period="day")
    dead_port = free_port()  # nothing listens there
    registration = {
        "name": f"dead-node-{dead_port}",
        "url": f"http://127.0.0.1:{dead_port}",
        "model": BROKEN_MODEL,
        "version": "v1",
        "served_model_name": BROKEN_MODEL,
        "max_model_len": 2048,
    }
    reply = call(
        "POST",
        platform.url + "/internal/v1/nodes/register",
        json_body=registration,
        headers={"Authorization": f"Bearer {platform.node_token}"},
    )
    assert reply.status == 201
    wait_for_refresh(platform)  # the node stays fresh for DMX_NODE_STALE_SECONDS
    failed = chat(platform.api_url, secret, body() | {"model": BROKEN_MODEL})
    assert failed.status == 503
    assert failed.json()["error"]["code"] == "upstream_unavailable"
    assert int(failed.headers["retry-after"]) >= 1
    assert quota_used(key.key_id) == 0
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=failed.headers["x-request-id"]).first(),
        timeout=15,
        what="the failed request's usage",
    )
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (
        "upstream_error",
        0,
        0,
    )


def test_quota_is_shared_by_a_tenant_plan_across_keys(platform, committed):
    from apps.keys.models import Plan, PlanQuota
    from apps.keys.services import tenant_keys_publish
    from tests.keys.factories import make_tenant

    plan = Plan.objects.create(name=f"small-{time.time_ns()}")
    PlanQuota.objects.create(plan=plan, period="day", model="", tokens=70)
    tenant = make_tenant()
    tenant.plan = plan
    tenant.save()
    tenant_keys_publish(tenant_ids=[tenant.id])
    _, first = make_api_key(tenant=tenant)
    _, second = make_api_key(tenant=tenant)
    assert chat(platform.api_url, first, body(max_tokens=20)).status == 200
    assert chat(platform.api_urls[1], second, body(max_tokens=40)).json()["error"]["code"] == (
        "insufficient_quota"
    )


def test_headers_on_success(platform, committed):
    _, secret = make_api_key(requests_per_minute=100, tokens_per_minute=10_000)
    reply = chat(platform.api_url, secret, body())
    for meter in ("requests", "tokens"):
        for kind in ("limit", "remaining", "reset"):
            assert f"x-ratelimit-{kind}-{meter}" in reply.headers
    assert reply.headers["x-ratelimit-limit-tokens"] == "10000"


def test_parallel_requests_never_exceed_the_limit(platform, committed):
    """Race both replicas with 12 requests against a limit of 5: exactly 5 get through."""
    _, secret = make_api_key(requests_per_minute=5)
    statuses = []

    def fire(url):
        statuses.append(chat(url, secret, body(max_tokens=1)).status)

    threads = [threading.Thread(target=fire, args=(platform.api_urls[i % 2],)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] * 5 + [429] * 7
