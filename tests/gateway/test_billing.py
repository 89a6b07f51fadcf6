"""Billing in money through two real gateway replicas and vLLM: budgets and prepaid balances
that hold exactly under concurrency on every endpoint, costs at the prices of the moment a
request arrived, unpriced models refused, a client that leaves paying what was generated."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db.models import Sum

from apps.billing.choices import BillingMode
from apps.billing.counters import balance_key
from apps.billing.models import Price, UsageRecord
from apps.billing.money import from_micros
from apps.billing.selectors import budget_status
from apps.billing.services import account_of, account_update, budget_set, price_set, top_up
from apps.models.models import ModelVersion
from dmxplatform.redis_client import request_redis
from tests.conftest import SERVED_MODELS, wait_for_refresh
from tests.gateway.test_limits import _open_stream
from tests.http import call
from tests.keys.factories import make_api_key, make_tenant
from tests.models.factories import TEST_PRICES, make_model
from tests.stack import wait_for

MODEL = SERVED_MODELS[0]
# Output only, so that a request's worst case is its max tokens at the output price whatever
# its prompt comes to on each endpoint: 2 tokens at 5 per million = 0.000010.
OUTPUT_PRICE = Decimal("5")
MAX_TOKENS = 2
WORST = 2 * 5  # micro-units


def _price_all_versions(input_price: str, cached: str, output: str) -> None:
    for version in ModelVersion.objects.filter(model__name=MODEL):
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


def request_for(endpoint: str, stream: bool) -> tuple[str, dict]:
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


def refusal_of(body: dict) -> tuple[str, str]:
    """(code, message) of a refusal in the endpoint's own shape: Anthropic's Messages errors
    carry a type (rate_limit_error for every 429), OpenAI's a code."""
    error = body["error"]
    return error.get("code") or error["type"], error["message"]


def fire_64(platform, secret: str) -> list[tuple[int, dict | None]]:
    """64 requests at once over both replicas, every endpoint, streamed and not."""
    results: list[tuple[int, dict | None]] = []
    start = threading.Barrier(64)

    def one(i: int) -> None:
        path, payload = request_for(ENDPOINTS[i % 4], stream=bool((i // 4) % 2))
        start.wait()
        reply = call(
            "POST", platform.api_urls[i % 2] + path, key=secret, json_body=payload, timeout=300
        )
        results.append((reply.status, reply.json() if reply.status != 200 else None))

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


def test_a_budget_admits_exactly_what_it_holds_over_both_replicas_and_every_endpoint(
    platform, output_priced
):
    tenant = make_tenant()
    _, secret = make_api_key(tenant=tenant)
    allowed = 20
    budget = budget_set(
        tenant_id=tenant.id, period="month", amount=from_micros(allowed * WORST + WORST - 1)
    )
    results = fire_64(platform, secret)
    admitted = [status for status, _ in results if status == 200]
    refused = [refusal_of(body) for status, body in results if status != 200]
    assert len(admitted) == allowed, sorted(status for status, _ in results)
    assert {status for status, _ in results if status != 200} == {429}
    assert {code for code, _ in refused} == {"insufficient_quota", "rate_limit_error"}
    assert all("monthly budget of 0.000209 USD" in message for _, message in refused)
    records = settled_records(tenant, 64)
    costs = [record.cost for record in records if record.status == "ok"]
    assert len(costs) == allowed and set(costs) == {from_micros(WORST)}
    total = sum((record.cost for record in records), Decimal(0))
    # Spend equals the records' costs to the micro-unit, and stays within the budget.
    (status,) = budget_status(tenant.id)
    assert status.budget == budget and status.spent == total <= budget.amount


def test_a_prepaid_balance_covers_exactly_what_it_holds_and_never_goes_below_zero(
    platform, output_priced
):
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), mode=BillingMode.PREPAID)
    allowed = 17
    start = from_micros(allowed * WORST + WORST - 1)
    top_up(tenant_id=tenant.id, amount=start, actor="test")
    _, secret = make_api_key(tenant=tenant)
    results = fire_64(platform, secret)
    assert sum(status == 200 for status, _ in results) == allowed
    codes = {refusal_of(body)[0] for status, body in results if status != 200}
    assert codes == {"insufficient_balance", "rate_limit_error"}
    records = settled_records(tenant, 64)
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
