"""Billing's management API: the price list, a tenant's account, movements, budgets,
redemptions and statement (its own only), cost on usage, and operators' top-ups, prices and
code batches; money as decimal strings, exact to the micro-unit."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from auditlog.models import LogEntry
from django.utils import timezone

from apps.billing.choices import BillingMode, MovementKind
from apps.billing.models import BalanceMovement, Budget, Price, RedemptionBatch
from apps.billing.services import account_update, budget_set, price_set, top_up
from apps.billing.services.balances import account_of
from apps.keys.choices import MemberRole, TokenScope
from tests.api.conftest import API, as_caller, as_staff, error_of, record_usage
from tests.keys.factories import make_api_key, make_member, make_tenant
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_redis_keys(private_redis):
    """Balances and budgets' counters these tests write are their own (tests/conftest.py)."""


@pytest.fixture
def owner():
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER))


@pytest.fixture
def member(owner):
    return as_caller(make_member(owner.tenant, role=MemberRole.MEMBER))


@pytest.fixture
def reader(owner):
    return as_caller(owner.membership, TokenScope.READ)


@pytest.fixture
def stranger():
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER))


@pytest.fixture
def operator():
    return as_staff("operator")


@pytest.fixture
def viewer():
    return as_staff("viewer")


def topped_up(operator, tenant_id: int, amount: str, key: str = "", **extra):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return operator.client.post(
        f"{API}/tenants/{tenant_id}/top-ups", {"amount": amount, **extra}, format="json", **headers
    )


# The price list --------------------------------------------------------------------------------


def test_the_price_list_shows_each_version_in_force_and_the_next_as_decimal_strings(member):
    _, version = make_model("list-priced")
    later = timezone.now() + timedelta(days=3)
    price_set(
        model_version_id=version.id,
        input_per_million=Decimal("0.2"),
        cached_input_per_million=Decimal("0.000001"),
        output_per_million=Decimal("123456.789012"),
        effective_from=later,
    )
    make_model("list-unpriced", prices=None)

    response = member.client.get(f"{API}/prices")
    assert response.status_code == 200
    lines = {line["model"]: line for line in response.json()}
    assert "list-unpriced" not in lines  # not offered to tenants that pay
    line = lines["list-priced"]
    assert line == {
        "model": "list-priced",
        "version": "v1",
        "kind": "generate",
        "currency": "USD",
        "input_per_million": "0.150000",
        "cached_input_per_million": "0.075000",
        "output_per_million": "0.600000",
        "free": False,
        "effective_from": line["effective_from"],
        "next": {
            "input_per_million": "0.200000",
            "cached_input_per_million": "0.000001",
            "output_per_million": "123456.789012",
            "effective_from": later.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        },
    }
    assert datetime.fromisoformat(line["effective_from"]) <= timezone.now()


def test_the_price_list_needs_a_management_credential(db, client):
    make_model("list-anonymous")
    response = client.get(f"{API}/prices")
    assert response.status_code == 401
    assert error_of(response)["code"] == "not_authenticated"


# A tenant's account, movements and money's exactness -------------------------------------------


def test_the_account_shows_mode_balance_and_currency_of_the_callers_tenant(owner, stranger):
    response = owner.client.get(f"{API}/billing/account")
    assert response.json() == {
        "mode": "postpaid",
        "balance": "0.000000",
        "currency": "USD",
        "low_balance_threshold": None,
        "notify_email": "",
        "webhook_url": "",
    }
    top_up(tenant_id=owner.tenant.id, amount=Decimal("12.345678"), actor="test")
    account_update(account=account_of(owner.tenant.id), mode=BillingMode.PREPAID)
    shown = owner.client.get(f"{API}/billing/account").json()
    assert (shown["mode"], shown["balance"]) == ("prepaid", "12.345678")
    assert stranger.client.get(f"{API}/billing/account").json()["balance"] == "0.000000"


def test_owners_set_the_alert_threshold_members_and_read_only_tokens_cannot(owner, member, reader):
    body = {"low_balance_threshold": "5.5", "webhook_url": "https://hooks.example.com/dmx"}
    for refused in (member, reader):
        response = refused.client.patch(f"{API}/billing/account", body, format="json")
        assert response.status_code == 403
        assert error_of(response)["code"] == "permission_denied"
    assert owner.client.get(f"{API}/billing/account").json()["low_balance_threshold"] is None

    response = owner.client.patch(
        f"{API}/billing/account", {**body, "mode": "prepaid"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["low_balance_threshold"] == "5.500000"
    assert response.json()["webhook_url"] == "https://hooks.example.com/dmx"
    assert response.json()["mode"] == "postpaid"  # the operators' to set, not the owner's
    refused = owner.client.patch(
        f"{API}/billing/account", {"webhook_url": "ftp://example.com/x"}, format="json"
    )
    assert refused.status_code == 400 and error_of(refused)["param"] == "webhook_url"


def test_money_moves_in_exact_micro_units_and_never_as_floats(operator, owner):
    for n in range(3):
        assert topped_up(operator, owner.tenant.id, "0.000001", key=f"micro-{n}").status_code == 201
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "0.000003"

    finer = topped_up(operator, owner.tenant.id, "0.0000001")
    assert finer.status_code == 400 and error_of(finer)["param"] == "amount"
    as_float = topped_up(operator, owner.tenant.id, 0.5)
    assert as_float.status_code == 400 and "decimal strings" in error_of(as_float)["message"]
    zero = topped_up(operator, owner.tenant.id, "0")
    assert zero.status_code == 400 and error_of(zero)["param"] == "amount"

    page = owner.client.get(f"{API}/billing/movements").json()
    assert [(m["amount"], m["balance_after"]) for m in page["results"]] == [
        ("0.000001", "0.000003"),
        ("0.000001", "0.000002"),
        ("0.000001", "0.000001"),
    ]
    assert all(m["kind"] == "top_up" and m["request_id"] is None for m in page["results"])
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "0.000003"


def test_movements_are_paginated_newest_first_and_filtered_by_kind(owner, operator):
    for n in range(5):
        topped_up(operator, owner.tenant.id, f"{n + 1}.000000", key=f"page-{n}")
    first = owner.client.get(f"{API}/billing/movements", {"limit": 2}).json()
    assert [m["amount"] for m in first["results"]] == ["5.000000", "4.000000"]
    second = owner.client.get(first["next"]).json()
    assert [m["amount"] for m in second["results"]] == ["3.000000", "2.000000"]
    charges = owner.client.get(f"{API}/billing/movements", {"kind": "charge"}).json()
    assert charges["results"] == []
    bad = owner.client.get(f"{API}/billing/movements", {"kind": "gift"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "kind"


def test_another_tenant_never_sees_the_movements(owner, stranger, operator):
    topped_up(operator, owner.tenant.id, "7.000000", note="owner-only-marker")
    assert "owner-only-marker" in owner.client.get(f"{API}/billing/movements").content.decode()
    assert stranger.client.get(f"{API}/billing/movements").json()["results"] == []


# Operators' top-ups ----------------------------------------------------------------------------


def test_a_top_up_is_idempotent_with_its_key_and_audited(operator, owner):
    first = topped_up(operator, owner.tenant.id, "10.000000", key="order-42", note="invoice 42")
    again = topped_up(operator, owner.tenant.id, "10.000000", key="order-42", note="invoice 42")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert first.json()["balance_after"] == "10.000000"
    movements = BalanceMovement.objects.filter(account__tenant=owner.tenant)
    assert movements.count() == 1
    movement = movements.get()
    assert (movement.kind, movement.amount, movement.actor) == (
        MovementKind.TOP_UP,
        Decimal("10.000000"),
        operator.user.get_username(),
    )
    entry = LogEntry.objects.get_for_object(movement).get(action=LogEntry.Action.CREATE)
    assert entry.actor == operator.user

    other = topped_up(operator, owner.tenant.id, "11.000000", key="order-42")
    assert other.status_code == 409
    assert error_of(other)["code"] == "idempotency_key_reused"
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "10.000000"

    bad_key = topped_up(operator, owner.tenant.id, "1.000000", key="x" * 101)
    assert bad_key.status_code == 400 and error_of(bad_key)["param"] == "Idempotency-Key"


def test_without_a_key_every_top_up_counts(operator, owner):
    topped_up(operator, owner.tenant.id, "1.000000")
    topped_up(operator, owner.tenant.id, "1.000000")
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "2.000000"


def test_operators_make_a_tenant_prepaid(operator, owner):
    url = f"{API}/tenants/{owner.tenant.id}/billing-account"
    assert operator.client.get(url).json()["mode"] == "postpaid"
    response = operator.client.patch(url, {"mode": "prepaid"}, format="json")
    assert response.status_code == 200
    assert response.json()["tenant"] == owner.tenant.id
    assert owner.client.get(f"{API}/billing/account").json()["mode"] == "prepaid"
    assert operator.client.get(f"{API}/tenants/999999999/billing-account").status_code == 404


def test_operator_endpoints_refuse_tenants_and_viewers_change_nothing(owner, viewer):
    _, version = make_model("refused-prices")
    prices_before = Price.objects.count()
    price_body = {"input_per_million": "1", "output_per_million": "2"}
    batch_body = {"face_value": "5", "count": 1}
    writes = [
        (f"{API}/tenants/{owner.tenant.id}/top-ups", {"amount": "5.000000"}),
        (f"{API}/model-versions/{version.id}/prices", price_body),
        (f"{API}/redemption-batches", batch_body),
        (f"{API}/tenants/{owner.tenant.id}/billing-account", {"mode": "prepaid"}),
    ]
    for url, body in writes:
        method = owner.client.patch if url.endswith("billing-account") else owner.client.post
        response = method(url, body, format="json")
        assert response.status_code == 404, url
        assert error_of(response)["code"] == "not_found"
        method = viewer.client.patch if url.endswith("billing-account") else viewer.client.post
        response = method(url, body, format="json")
        assert response.status_code == 403, url
    for url in (
        f"{API}/redemption-batches",
        f"{API}/model-versions/{version.id}/prices",
        f"{API}/tenants/{owner.tenant.id}/billing-account",
    ):
        assert owner.client.get(url).status_code == 404
        assert viewer.client.get(url).status_code == 200
    assert not BalanceMovement.objects.exists()
    assert not RedemptionBatch.objects.exists()
    assert Price.objects.count() == prices_before
    assert owner.client.get(f"{API}/billing/account").json()["mode"] == "postpaid"


# Operators' prices -----------------------------------------------------------------------------


def test_operators_set_prices_ahead_and_mark_a_version_free(operator, settings):
    settings.DMX_PRICE_LEAD_SECONDS = 60
    _, version = make_model("api-priced")
    url = f"{API}/model-versions/{version.id}/prices"
    too_soon = operator.client.post(
        url,
        {
            "input_per_million": "1",
            "output_per_million": "2",
            "effective_from": (timezone.now() + timedelta(seconds=5)).isoformat(),
        },
        format="json",
    )
    assert too_soon.status_code == 400 and error_of(too_soon)["param"] == "effective_from"
    dearer = operator.client.post(
        url,
        {"input_per_million": "1", "cached_input_per_million": "2", "output_per_million": "2"},
        format="json",
    )
    assert dearer.status_code == 400
    assert error_of(dearer)["param"] == "cached_input_per_million"

    free = operator.client.post(
        url,
        {"input_per_million": "0", "output_per_million": "0", "cached_input_per_million": "0"},
        format="json",
    )
    assert free.status_code == 201, free.content
    assert free.json()["free"] is True
    assert free.json()["created_by"] == operator.user.get_username()
    starts = datetime.fromisoformat(free.json()["effective_from"])
    assert starts >= timezone.now() + timedelta(seconds=55)

    listed = operator.client.get(url).json()
    assert [p["input_per_million"] for p in listed] == ["0.000000", "0.150000"]
    assert operator.client.get(f"{API}/model-versions/999999999/prices").status_code == 404


# Budgets ---------------------------------------------------------------------------------------


def test_owners_set_budgets_members_read_them(owner, member, reader):
    url = f"{API}/billing/budgets"
    body = {"period": "month", "amount": "10.000001", "hard": True}
    for refused in (member, reader):
        response = refused.client.post(url, body, format="json")
        assert response.status_code == 403
    assert not Budget.objects.exists()

    created = owner.client.post(url, body, format="json")
    assert created.status_code == 201, created.content
    shown = created.json()
    assert (shown["amount"], shown["spent"], shown["key"], shown["hard"]) == (
        "10.000001",
        "0.000000",
        None,
        True,
    )
    assert member.client.get(url).json() == [shown]

    detail = f"{url}/{shown['id']}"
    changed = owner.client.patch(detail, {"amount": "9.999999", "hard": False}, format="json")
    assert changed.status_code == 200
    assert (changed.json()["amount"], changed.json()["hard"]) == ("9.999999", False)
    assert member.client.patch(detail, {"amount": "1"}, format="json").status_code == 403
    assert member.client.delete(detail).status_code == 403
    assert owner.client.delete(detail).status_code == 204
    assert owner.client.get(detail).status_code == 404
    assert not Budget.objects.exists()


def test_a_keys_budget_names_one_of_the_tenants_keys(owner, stranger):
    key, _ = make_api_key(owner.tenant)
    foreign, _ = make_api_key(stranger.tenant)
    url = f"{API}/billing/budgets"
    created = owner.client.post(
        url, {"period": "day", "amount": "1", "key": key.key_id}, format="json"
    )
    assert created.status_code == 201 and created.json()["key"] == key.key_id
    refused = owner.client.post(
        url, {"period": "day", "amount": "1", "key": foreign.key_id}, format="json"
    )
    assert refused.status_code == 400 and error_of(refused)["param"] == "key"
    assert not Budget.objects.filter(api_key=foreign).exists()


def test_another_tenant_can_neither_read_nor_change_a_budget(owner, stranger):
    created = owner.client.post(
        f"{API}/billing/budgets", {"period": "week", "amount": "3"}, format="json"
    )
    detail = f"{API}/billing/budgets/{created.json()['id']}"
    assert stranger.client.get(detail).status_code == 404
    assert stranger.client.patch(detail, {"amount": "1000"}, format="json").status_code == 404
    assert stranger.client.delete(detail).status_code == 404
    assert stranger.client.get(f"{API}/billing/budgets").json() == []
    budget = Budget.objects.get()
    assert (budget.tenant_id, budget.amount) == (owner.tenant.id, Decimal("3"))


def test_a_budget_the_operators_set_binds_the_owners_who_can_only_add_their_own(owner):
    locked = budget_set(tenant_id=owner.tenant.id, period="month", amount=Decimal(50), locked=True)
    url = f"{API}/billing/budgets"
    detail = f"{url}/{locked.id}"
    assert owner.client.get(detail).json()["locked"] is True
    for refused in (
        owner.client.patch(detail, {"amount": "5000"}, format="json"),
        owner.client.delete(detail),
        # Setting the scope and period again would replace it.
        owner.client.post(url, {"period": "month", "amount": "5000"}, format="json"),
    ):
        assert refused.status_code == 403, refused.content
        error = error_of(refused)
        assert error["code"] == "budget_locked"
        assert (
            "monthly budget of 50.000000 USD was set by the platform's operators"
            in (error["message"])
        )
    locked.refresh_from_db()
    assert (locked.amount, locked.hard) == (Decimal(50), True)
    # A budget of their own, for another period, limits more; they change it as they like.
    own = owner.client.post(url, {"period": "day", "amount": "2"}, format="json")
    assert own.status_code == 201 and own.json()["locked"] is False
    assert owner.client.delete(f"{url}/{own.json()['id']}").status_code == 204
    # The operators unlock it: the owners' again.
    budget_set(tenant_id=owner.tenant.id, period="month", amount=Decimal(50), locked=False)
    assert owner.client.patch(detail, {"amount": "40"}, format="json").status_code == 200
    assert Budget.objects.get(id=locked.id).amount == Decimal(40)


# Redemption codes ------------------------------------------------------------------------------


def test_a_batchs_codes_are_shown_once_and_each_credits_one_tenant_once(
    operator, owner, stranger, reader
):
    made = operator.client.post(
        f"{API}/redemption-batches",
        {"face_value": "2.500000", "count": 3, "note": "conference"},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made["Cache-Control"] == "no-store"
    codes = made.json()["codes"]
    assert len(set(codes)) == 3 and made.json()["redeemed"] == 0
    batch_id = made.json()["id"]

    refused = reader.client.post(f"{API}/billing/redeem", {"code": codes[0]}, format="json")
    assert refused.status_code == 403
    redeemed = owner.client.post(f"{API}/billing/redeem", {"code": codes[0]}, format="json")
    assert redeemed.status_code == 201, redeemed.content
    assert (redeemed.json()["kind"], redeemed.json()["amount"]) == ("redemption", "2.500000")
    for caller in (owner, stranger):
        again = caller.client.post(f"{API}/billing/redeem", {"code": codes[0]}, format="json")
        assert again.status_code == 409
        assert error_of(again)["code"] == "redemption_code_used"
    # Typed by hand: lower case, no dashes.
    typed = codes[1].lower().replace("-", "")
    typed_in = stranger.client.post(f"{API}/billing/redeem", {"code": typed}, format="json")
    assert typed_in.status_code == 201
    unknown = owner.client.post(
        f"{API}/billing/redeem", {"code": "DMX-0000-0000-0000-0000-0000"}, format="json"
    )
    assert unknown.status_code == 400
    assert error_of(unknown)["code"] == "redemption_code_invalid"
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "2.500000"
    assert stranger.client.get(f"{API}/billing/account").json()["balance"] == "2.500000"

    shown_later = [
        operator.client.get(f"{API}/redemption-batches").content.decode(),
        operator.client.get(f"{API}/redemption-batches/{batch_id}").content.decode(),
    ]
    assert not any(code in page for code in codes for page in shown_later)
    detail = operator.client.get(f"{API}/redemption-batches/{batch_id}").json()
    assert detail["redeemed"] == 2
    assert [c["hint"] for c in detail["codes"]] == [code[-4:] for code in codes]
    assert [c["redeemed_by"] for c in detail["codes"]] == [
        owner.tenant.id,
        stranger.tenant.id,
        None,
    ]


def test_an_expired_code_is_refused(operator, owner):
    made = operator.client.post(
        f"{API}/redemption-batches",
        {"face_value": "1", "count": 1, "expires_at": (timezone.now() + timedelta(hours=1))},
        format="json",
    )
    RedemptionBatch.objects.filter(id=made.json()["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = owner.client.post(
        f"{API}/billing/redeem", {"code": made.json()["codes"][0]}, format="json"
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "redemption_code_expired"
    assert not BalanceMovement.objects.exists()
    past = operator.client.post(
        f"{API}/redemption-batches",
        {"face_value": "1", "count": 1, "expires_at": "2001-01-01T00:00:00Z"},
        format="json",
    )
    assert past.status_code == 400 and error_of(past)["param"] == "expires_at"


# Usage with cost, and the monthly statement ----------------------------------------------------


def test_usage_records_and_daily_totals_carry_cached_tokens_and_cost(owner):
    key, _ = make_api_key(owner.tenant)
    for cost in (1, 2):
        record_usage(
            key, model="cost-m", prompt_tokens=100, cached_tokens=40, cost_micros=cost * 500_001
        )
    records = owner.client.get(f"{API}/usage/records").json()["results"]
    assert sorted(r["cost"] for r in records) == ["0.500001", "1.000002"]
    assert {r["cached_tokens"] for r in records} == {40}
    days = owner.client.get(f"{API}/usage/daily").json()["results"]
    assert [(d["cost"], d["cached_tokens"]) for d in days] == [("1.500003", 80)]


def test_the_statement_adds_up_usage_per_model_and_movements_by_kind(owner, stranger, operator):
    key, _ = make_api_key(owner.tenant)
    account_update(account=account_of(owner.tenant.id), mode=BillingMode.PREPAID)
    topped_up(operator, owner.tenant.id, "10.000000")
    now = time.time()
    usage = [("stmt-a", 100, 10, 20, 1_234), ("stmt-a", 50, 0, 5, 1), ("stmt-b", 7, 7, 3, 999)]
    for model, prompt, cached, completion, cost in usage:
        record_usage(
            key,
            model=model,
            created_at=now,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            cost_micros=cost,
            prepaid=True,
        )
    month = f"{datetime.fromtimestamp(now, UTC):%Y-%m}"
    statement = owner.client.get(f"{API}/billing/statement", {"month": month}).json()
    assert statement == {
        "month": month,
        "currency": "USD",
        "lines": [
            {
                "model": "stmt-a",
                "batch": False,
                "requests": 2,
                "prompt_tokens": 150,
                "cached_tokens": 10,
                "completion_tokens": 25,
                "cost": "0.001235",
            },
            {
                "model": "stmt-b",
                "batch": False,
                "requests": 1,
                "prompt_tokens": 7,
                "cached_tokens": 7,
                "completion_tokens": 3,
                "cost": "0.000999",
            },
        ],
        "total": "0.002234",
        "movements": {"top_up": "10.000000", "charge": "-0.002234"},
    }
    assert owner.client.get(f"{API}/billing/account").json()["balance"] == "9.997766"
    assert owner.client.get(f"{API}/billing/statement").json()["month"] == month

    theirs = stranger.client.get(f"{API}/billing/statement", {"month": month}).json()
    assert (theirs["lines"], theirs["total"], theirs["movements"]) == ([], "0.000000", {})
    for bad in ("2026-13", "26-01", "9999-12", "May"):
        response = owner.client.get(f"{API}/billing/statement", {"month": bad})
        assert response.status_code == 400, bad
        assert error_of(response)["param"] == "month"


def test_the_schema_describes_the_billing_endpoints(client):
    paths = client.get("/api/schema/", {"format": "json"}).json()["paths"]
    assert {
        f"{API}/prices",
        f"{API}/billing/account",
        f"{API}/billing/movements",
        f"{API}/billing/budgets",
        f"{API}/billing/budgets/{{id}}",
        f"{API}/billing/redeem",
        f"{API}/billing/statement",
        f"{API}/tenants/{{id}}/billing-account",
        f"{API}/tenants/{{id}}/top-ups",
        f"{API}/model-versions/{{id}}/prices",
        f"{API}/redemption-batches",
        f"{API}/redemption-batches/{{id}}",
    } <= set(paths)
    cost = client.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    assert cost["UsageRecordOutput"]["properties"]["cost"]["type"] == "string"


def test_a_webhook_secret_saved_with_its_account_is_hidden_in_the_audit_log(owner):
    account = account_of(owner.tenant.id)
    secret = "whsec_" + "s" * 43
    account.webhook_secret = secret
    account.save()
    entry = LogEntry.objects.get_for_object(account).latest("timestamp")
    assert entry.changes["webhook_secret"] == ["", "(hidden)"]
    assert secret not in str(entry.changes)
