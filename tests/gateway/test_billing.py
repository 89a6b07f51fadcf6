"""Billing in money through two real gateway replicas and vLLM: budgets and prepaid balances
that hold exactly under concurrency on every endpoint (the portal's playground included), costs
at the prices of the moment a request arrived, unpriced models refused, a client that leaves
paying what was generated."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import pytest
from django.conf import settings
from django.db.models import Sum
from django.test import Client
from websockets.sync.client import connect

from apps.billing.choices import BillingMode
from apps.billing.counters import balance_key
from apps.billing.models import Price, UsageRecord
from apps.billing.money import from_micros
from apps.billing.selectors import budget_status
from apps.billing.services import account_of, account_update, budget_set, price_set, top_up
from apps.gateway.schemas import Endpoint
from apps.models.models import ModelVersion
from dmxplatform.redis_client import request_redis
from tests.conftest import EMBED_MODEL, SERVED_MODELS, wait_for_refresh
from tests.gateway.test_limits import _open_stream
from tests.http import call
from tests.keys.factories import make_api_key, make_member, make_tenant, make_user
from tests.models.factories import TEST_PRICES, make_model
from tests.portal.test_playground import Member, chat
from tests.stack import wait_for

MODEL = SERVED_MODELS[0]
# Output only, so that a request's worst case is its max tokens at the output price whatever
# its prompt comes to on each endpoint: 2 tokens at 5 per million = 0.000010.
OUTPUT_PRICE = Decimal("5")
MAX_TOKENS = 2
WORST = 2 * 5  # micro-units
# Embeddings are billed at input only: two tokens, given as ids so that no tokenizer stands
# between the gateway's count and the engine's, at the same 5 per million make the same WORST.
EMBED_INPUT = [300, 301]
EMBED_INPUT_PRICE = OUTPUT_PRICE


def _price_all_versions(input_price: str, cached: str, output: str, *, model: str = MODEL) -> None:
    for version in ModelVersion.objects.filter(model__name=model):
        price_set(
            model_version_id=version.id,
            input_per_million=Decimal(input_price),
            cached_input_per_million=Decimal(cached),
            output_per_million=Decimal(output),
        )


@pytest.fixture
def output_priced(platform, committed, settings):
    """MODEL priced at output only for the test (a new price from now: past costs stand),
    and back at the suite's prices after it."""
    settings.DMX_PRICE_LEAD_SECONDS = 0
    _price_all_versions("0", "0", str(OUTPUT_PRICE))
    wait_for_refresh(platform)
    yield
    _price_all_versions(*TEST_PRICES)
    wait_for_refresh(platform)


@pytest.fixture
def every_endpoint_priced(platform, output_priced, embed_worker):
    """output_priced, and EMBED_MODEL served and priced at input only, so that every request
    of fire_64 has the same worst case, WORST, and costs exactly that: which of them win the
    race does not change how many fit. Cached input at the input price: whatever the engine's
    cache serves, the cost stays the worst case."""
    price = str(EMBED_INPUT_PRICE)
    _price_all_versions(price, price, "0", model=EMBED_MODEL)
    wait_for_refresh(platform)
    yield
    _price_all_versions(*TEST_PRICES, model=EMBED_MODEL)
    wait_for_refresh(platform)


def request_for(endpoint: str, stream: bool) -> tuple[str, dict]:
    if endpoint == "embeddings":
        return "/embeddings", {"model": EMBED_MODEL, "input": EMBED_INPUT}
    common = {"model": MODEL, "ignore_eos": True, "stream": stream}
    if endpoint == "chat":
        messages = [{"role": "user", "content": "hi"}]
        return "/chat/completions", {**common, "messages": messages, "max_tokens": MAX_TOKENS}
    if endpoint == "completions":
        return "/completions", {**common, "prompt": "hi", "max_tokens": MAX_TOKENS}
    if endpoint == "responses":
        return "/responses", {**common, "input": "hi", "max_output_tokens": MAX_TOKENS}
    messages = [{"role": "user", "content": "hi"}]
    return "/messages", {**common, "messages": messages, "max_tokens": MAX_TOKENS}


ENDPOINTS = ("chat", "completions", "responses", "messages")
# Every way in: the generating APIs streamed and not, embeddings (which never stream) and the
# portal's playground (a chat that always streams, over a signed-in member's WebSocket).
KINDS = (
    *((endpoint, stream) for endpoint in ENDPOINTS for stream in (False, True)),
    ("embeddings", False),
    ("playground", True),
)


def refusal_of(body: dict) -> tuple[str, str]:
    """(code, message) of a refusal in the endpoint's own shape: Anthropic's Messages errors
    carry a type (rate_limit_error for every 429), OpenAI's a code."""
    error = body["error"]
    return error.get("code") or error["type"], error["message"]


def signed_in_member(tenant) -> Member:
    """A signed-in member of `tenant`, with a key of the tenant's for the playground."""
    user = make_user()
    make_member(tenant, user)
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return Member(session=session, keys=[make_api_key(tenant)[0]])


# A playground answer never carries an HTTP status: its refusals are counted under this one,
# and their usage records say which status the pipeline gave them.
PLAYGROUND_REFUSED = 0
# How long one of the 64 may take: they share two cores with four engines.
REQUEST_TIMEOUT = 300


def fire_64(platform, secret: str, member: Member) -> list[tuple[int, dict | None]]:
    """64 requests at once over both replicas, every kind of KINDS: (status, error body)."""
    results: list[tuple[int, dict | None]] = []
    start = threading.Barrier(64, timeout=REQUEST_TIMEOUT)

    def api(url: str, kind: str, stream: bool) -> None:
        path, payload = request_for(kind, stream)
        start.wait()
        reply = call(
            "POST", url + "/v1" + path, key=secret, json_body=payload, timeout=REQUEST_TIMEOUT
        )
        results.append((reply.status, reply.json() if reply.status != 200 else None))

    def playground(url: str) -> None:
        cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={member.session}"}
        socket_url = url.replace("http://", "ws://", 1) + "/ws/playground"
        with connect(socket_url, origin=url, additional_headers=cookie, proxy=None) as socket:
            start.wait()
            # Greedy, on a prompt the tiny model answers to max_tokens: it costs WORST too.
            socket.send(json.dumps(chat(member.keys[0], max_tokens=MAX_TOKENS)))
            while (message := json.loads(socket.recv(timeout=REQUEST_TIMEOUT)))["type"] == "delta":
                pass
        results.append((200, None) if message["type"] == "done" else (PLAYGROUND_REFUSED, message))

    def one(i: int) -> None:
        kind, stream = KINDS[i % len(KINDS)]
        # Each kind to both replicas in turn.
        url = platform.stack.gateways[(i + i // len(KINDS)) % 2]
        if kind == "playground":
            playground(url)
        else:
            api(url, kind, stream)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def settled_records(tenant, count: int):
    return wait_for(
        lambda: (
            list(UsageRecord.objects.filter(tenant=tenant))
            if UsageRecord.objects.filter(tenant=tenant).count() >= count
            else None
        ),
        timeout=60,
        what=f"the {count} usage records",
    )


def kinds_recorded(records, member: Member) -> set[tuple[str, bool]]:
    """The (kind, stream) of each record: its endpoint, or the playground for its key's."""
    return {
        ("playground" if record.api_key_id == member.keys[0].id else record.endpoint, record.stream)
        for record in records
    }


# How many of the 64 the playground sends, and every kind as kinds_recorded names it.
PLAYGROUND_REQUESTS = sum(KINDS[i % len(KINDS)][0] == "playground" for i in range(64))
RECORDED_KINDS = {(Endpoint.CHAT.value if k == "chat" else k, stream) for k, stream in KINDS}


def test_a_budget_admits_exactly_what_it_holds_over_both_replicas_and_every_endpoint(
    platform, every_endpoint_priced
):
    tenant = make_tenant()
    _, secret = make_api_key(tenant=tenant)
    member = signed_in_member(tenant)  # the tenant's budget holds the playground's key too
    allowed = 20
    budget = budget_set(
        tenant_id=tenant.id, period="month", amount=from_micros(allowed * WORST + WORST - 1)
    )
    results = fire_64(platform, secret, member)
    assert len(results) == 64
    admitted = [status for status, _ in results if status == 200]
    refused = [refusal_of(body) for status, body in results if status != 200]
    assert len(admitted) == allowed, sorted(status for status, _ in results)
    assert {status for status, _ in results if status != 200} <= {429, PLAYGROUND_REFUSED}
    assert {code for code, _ in refused} == {"insufficient_quota", "rate_limit_error"}
    assert all("monthly budget of 0.000209 USD" in message for _, message in refused)
    records = settled_records(tenant, 64)
    # Every kind was in the race and is on the book, the playground's answers and refusals
    # included; every refusal, the playground's too, was the budget's 429.
    assert kinds_recorded(records, member) == RECORDED_KINDS
    assert sum(record.api_key_id == member.keys[0].id for record in records) == PLAYGROUND_REQUESTS
    assert {record.http_status for record in records if record.status != "ok"} == {429}
    costs = [record.cost for record in records if record.status == "ok"]
    assert len(costs) == allowed and set(costs) == {from_micros(WORST)}
    total = sum((record.cost for record in records), Decimal(0))
    # Spend equals the records' costs to the micro-unit, and stays within the budget.
    (status,) = budget_status(tenant.id)
    assert status.budget == budget and status.spent == total <= budget.amount


def test_a_prepaid_balance_covers_exactly_what_it_holds_and_never_goes_below_zero(
    platform, every_endpoint_priced
):
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), mode=BillingMode.PREPAID)
    allowed = 17
    start = from_micros(allowed * WORST + WORST - 1)
    top_up(tenant_id=tenant.id, amount=start, actor="test")
    _, secret = make_api_key(tenant=tenant)
    member = signed_in_member(tenant)
    results = fire_64(platform, secret, member)
    assert len(results) == 64
    assert sum(status == 200 for status, _ in results) == allowed
    codes = {refusal_of(body)[0] for status, body in results if status != 200}
    assert codes == {"insufficient_balance", "rate_limit_error"}
    records = settled_records(tenant, 64)
    assert kinds_recorded(records, member) == RECORDED_KINDS
    assert {record.http_status for record in records if record.status != "ok"} == {429}
    assert {record.cost for record in records if record.status == "ok"} == {from_micros(WORST)}
    spent = sum((record.cost for record in records), Decimal(0))
    assert spent == from_micros(allowed * WORST)
    held = int(request_redis().get(balance_key(tenant.id)))
    assert held == allowed * WORST + WORST - 1 - allowed * WORST >= 0
    # The book: one charge per billed request, the balance the sum of its movements.
    account = wait_for(
        lambda: (
            account_of(tenant.id)
            if account_of(tenant.id).movements.filter(kind="charge").count() == allowed
            else None
        ),
        timeout=30,
        what="the charges",
    )
    assert account.balance == start - spent == from_micros(held)
    assert account.movements.aggregate(total=Sum("amount"))["total"] == account.balance


def test_a_client_that_leaves_mid_stream_pays_what_was_generated(platform, output_priced):
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), mode=BillingMode.PREPAID)
    top_up(tenant_id=tenant.id, amount=Decimal("1"), actor="test")
    _, secret = make_api_key(tenant=tenant)
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    connection, response = _open_stream(platform.api_url, secret, payload)
    request_id = response.getheader("x-request-id")
    response.readline()
    response.close()
    connection.close()
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what="the cut stream's record",
    )
    assert record.status == "client_disconnected" and 0 < record.completion_tokens < 1500
    # The prompt is free here: the cost is the generated tokens at 5 per million, exactly.
    assert record.cost == from_micros(record.completion_tokens * 5)
    # The balance Redis holds got back everything but that (the 1500-token hold included).
    held = int(request_redis().get(balance_key(tenant.id)))
    assert held == 1_000_000 - record.completion_tokens * 5


def test_a_price_change_between_two_requests_bills_each_at_its_own_price(platform, output_priced):
    tenant = make_tenant()
    _, secret = make_api_key(tenant=tenant)
    path, payload = request_for("chat", stream=False)
    first = call("POST", platform.api_url + path, key=secret, json_body=payload)
    _price_all_versions("0", "0", "7")
    wait_for_refresh(platform)
    second = call("POST", platform.api_urls[1] + path, key=secret, json_body=payload)
    assert (first.status, second.status) == (200, 200)
    records = settled_records(tenant, 2)
    cost = {r.request_id: r.cost for r in records}
    assert cost[first.headers["x-request-id"]] == from_micros(MAX_TOKENS * 5)
    assert cost[second.headers["x-request-id"]] == from_micros(MAX_TOKENS * 7)


def test_a_model_without_a_price_is_refused_naming_it(platform, committed):
    make_model("unpriced-model", prices=None)
    wait_for_refresh(platform)
    _, secret = make_api_key()
    reply = call(
        "POST",
        platform.api_url + "/chat/completions",
        key=secret,
        json_body={"model": "unpriced-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert reply.status == 403
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_priced", "model")
    assert "`unpriced-model` has no price" in error["message"]
    assert not Price.objects.filter(model_version__model__name="unpriced-model").exists()
