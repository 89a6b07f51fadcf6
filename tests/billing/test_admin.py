"""Billing in the operator console: prices set through price_set and never edited, accounts
topped up (a movement and an audit entry each, once per form), budgets through budget_set, code
batches whose codes are shown once, as a page and a CSV, and redeem; the console's roles; cost
on the keys' usage pages."""

from __future__ import annotations

import base64
import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from auditlog.models import LogEntry
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from apps.billing.choices import BillingMode, MovementKind
from apps.billing.models import (
    BalanceMovement,
    BillingAccount,
    Budget,
    Price,
    RedemptionBatch,
    RedemptionCode,
)
from apps.billing.pricing import PRICES_VERSION
from apps.billing.services import account_of, budget_set, price_set, redeem, top_up
from apps.keys.models import Plan
from dmxplatform.redis_client import sync_redis
from tests.api.conftest import record_usage
from tests.keys.factories import make_api_key, make_staff, make_tenant
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]

ADMIN = "/admin/billing"
ONCE = re.compile(r'name="once" value="([0-9a-f]{32})"')
CODE = re.compile(r"DMX(?:-[0-9A-Z]{4}){5}")
MODELS = (
    "price",
    "billingaccount",
    "balancemovement",
    "budget",
    "redemptionbatch",
    "redemptioncode",
    "notification",
    # The usage ledger, moved here from keys with its content types (billing.0005): the grants
    # the roles had on it hold.
    "usagerecord",
    "usagedaily",
)


@pytest.fixture
def operator(client):
    user = make_staff("operator")
    client.force_login(user)
    return user


@pytest.fixture
def viewer(client):
    user = make_staff("viewer")
    client.force_login(user)
    return user


def once_of(page) -> str:
    """The form's one-time token, as the page rendered it."""
    found = ONCE.search(page.content.decode())
    assert found, page.content.decode()[:2000]
    return found.group(1)


# Roles -----------------------------------------------------------------------------------------


def test_the_console_roles_cover_billings_models():
    ours = set(Permission.objects.filter(content_type__app_label="billing"))
    assert len(ours) == 4 * len(MODELS)
    operator = set(Group.objects.get(name="operator").permissions.all())
    viewer = set(Group.objects.get(name="viewer").permissions.all())
    assert ours <= operator
    assert {p for p in ours if p.codename.startswith("view_")} == ours & viewer


def test_every_billing_action_runs_only_for_those_who_may_operate():
    billing = [m for m in admin.site._registry.items() if m[0]._meta.app_label == "billing"]
    assert {model._meta.model_name for model, _ in billing} == set(MODELS)
    actions = 0
    for model, model_admin in billing:
        for name in model_admin.actions or ():
            action = getattr(model_admin, name)
            assert "operate" in action.allowed_permissions, f"{model.__name__}: {name}"
            actions += 1
    assert actions >= 2  # mark free, top up


def test_a_viewer_sees_every_billing_page_and_changes_nothing(client, viewer):
    tenant = make_tenant()
    account = account_of(tenant.id)
    _, version = make_model("viewer-priced")
    for model in MODELS:
        assert client.get(f"{ADMIN}/{model}/").status_code == 200, model
    page = client.get(f"{ADMIN}/billingaccount/{account.id}/change/").content.decode()
    assert "top-up/" not in page and 'value="top_up"' not in page
    assert 'value="mark_free"' not in client.get(f"{ADMIN}/price/").content.decode()

    top_up_url = f"{ADMIN}/billingaccount/{account.id}/top-up/"
    assert client.get(top_up_url).status_code == 403
    refused = client.post(top_up_url, {"amount": "5", "note": "", "once": "a" * 32})
    assert refused.status_code == 403
    assert client.get(f"{ADMIN}/redemptionbatch/add/").status_code == 403
    assert client.post(f"{ADMIN}/redemptionbatch/add/", {"face_value": "1"}).status_code == 403
    assert client.get(f"{ADMIN}/price/add/").status_code == 403
    price = Price.objects.get(model_version=version)
    client.post(f"{ADMIN}/price/", {"action": "mark_free", "_selected_action": [price.id]})
    assert not BalanceMovement.objects.exists()
    assert not RedemptionBatch.objects.exists()
    assert list(Price.objects.filter(model_version=version)) == [price]


# Prices ----------------------------------------------------------------------------------------


def test_a_price_is_added_through_price_set_ahead_of_time(
    client, operator, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    settings.DMX_PRICE_LEAD_SECONDS = 60
    _, version = make_model("console-priced")
    before = int(sync_redis().get(PRICES_VERSION.key) or 0)
    form = {
        "model_version": version.id,
        "input_per_million": "2.000001",
        "cached_input_per_million": "",
        "output_per_million": "3",
        "effective_from_0": "",
        "effective_from_1": "",
    }
    assert client.get(f"{ADMIN}/price/add/?model_version={version.id}").status_code == 200
    soon = timezone.now() + timedelta(seconds=10)
    too_soon = client.post(
        f"{ADMIN}/price/add/",
        {
            **form,
            "effective_from_0": soon.strftime("%Y-%m-%d"),
            "effective_from_1": soon.strftime("%H:%M:%S"),
        },
    )
    assert too_soon.status_code == 200
    assert "no earlier than" in too_soon.content.decode()
    assert Price.objects.filter(model_version=version).count() == 1

    with capture(execute=True):
        response = client.post(f"{ADMIN}/price/add/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    price = Price.objects.filter(model_version=version).order_by("-effective_from").first()
    assert (price.input_per_million, price.cached_input_per_million) == (
        Decimal("2.000001"),
        Decimal("2.000001"),
    )
    assert price.effective_from >= timezone.now() + timedelta(seconds=55)
    assert price.created_by == operator.get_username()
    assert int(sync_redis().get(PRICES_VERSION.key) or 0) == before + 1  # gateways reload
    entry = LogEntry.objects.get_for_object(price).get(action=LogEntry.Action.CREATE)
    assert entry.actor == operator


def test_a_price_is_never_edited_and_only_a_scheduled_one_is_withdrawn(client, operator):
    _, version = make_model("console-history")
    in_force = Price.objects.get(model_version=version)
    scheduled = price_set(
        model_version_id=version.id,
        input_per_million=Decimal(1),
        output_per_million=Decimal(1),
        effective_from=timezone.now() + timedelta(days=1),
    )
    change = client.post(
        f"{ADMIN}/price/{in_force.id}/change/",
        {"model_version": version.id, "input_per_million": "9", "output_per_million": "9"},
    )
    assert change.status_code == 403
    assert client.get(f"{ADMIN}/price/{in_force.id}/delete/").status_code == 403
    client.post(f"{ADMIN}/price/{in_force.id}/delete/", {"post": "yes"})
    in_force.refresh_from_db()
    assert in_force.input_per_million == Decimal("0.15")

    listed = client.get(f"{ADMIN}/price/?model_version__id__exact={version.id}").content.decode()
    assert "in force" in listed and "scheduled" in listed
    response = client.post(f"{ADMIN}/price/{scheduled.id}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert list(Price.objects.filter(model_version=version)) == [in_force]


def test_a_version_is_marked_free_from_the_form_or_the_list(client, operator, settings):
    settings.DMX_PRICE_LEAD_SECONDS = 0
    _, by_form = make_model("console-free-form", prices=None)
    response = client.post(
        f"{ADMIN}/price/add/",
        {
            "model_version": by_form.id,
            "free": "on",
            "effective_from_0": "",
            "effective_from_1": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Price.objects.get(model_version=by_form).free

    _, by_action = make_model("console-free-action")
    priced = Price.objects.get(model_version=by_action)
    assert not priced.free
    client.post(f"{ADMIN}/price/", {"action": "mark_free", "_selected_action": [priced.id]})
    newest = Price.objects.filter(model_version=by_action).order_by("-effective_from").first()
    assert newest != priced and newest.free


# Accounts and top-ups --------------------------------------------------------------------------


def test_an_operator_top_up_is_a_movement_with_an_audit_entry_and_counts_once(client, operator):
    tenant = make_tenant()
    account = account_of(tenant.id)
    url = f"{ADMIN}/billingaccount/{account.id}/top-up/"
    page = client.get(url)
    assert page.status_code == 200
    form = {"amount": "2.000001", "note": "invoice 7", "once": once_of(page)}

    response = client.post(url, form)
    assert response.status_code == 302
    assert response["Location"].endswith(f"/billingaccount/{account.id}/change/")
    again = client.post(url, form)  # a reload, a double click
    assert again.status_code == 302

    movement = BalanceMovement.objects.get(account=account)
    assert (movement.kind, movement.amount, movement.note, movement.actor) == (
        MovementKind.TOP_UP,
        Decimal("2.000001"),
        "invoice 7",
        operator.get_username(),
    )
    entry = LogEntry.objects.get_for_object(movement).get(action=LogEntry.Action.CREATE)
    assert entry.actor == operator
    account.refresh_from_db()
    assert account.balance == Decimal("2.000001")

    another = client.post(url, {**form, "once": once_of(client.get(url))})
    assert another.status_code == 302
    account.refresh_from_db()
    assert account.balance == Decimal("4.000002")
    shown = client.get(f"{ADMIN}/billingaccount/{account.id}/change/").content.decode()
    assert "4.000002" in shown and "invoice 7" in shown and "top-up/" in shown

    wrong = client.post(url, {**form, "amount": "0.0000001", "once": once_of(client.get(url))})
    assert wrong.status_code == 200
    assert BalanceMovement.objects.filter(account=account).count() == 2


def test_the_top_up_action_opens_the_page_for_one_account(client, operator):
    account = account_of(make_tenant().id)
    other = account_of(make_tenant().id)
    response = client.post(
        f"{ADMIN}/billingaccount/", {"action": "top_up", "_selected_action": [account.id]}
    )
    assert response.status_code == 302
    assert response["Location"].endswith(f"/billingaccount/{account.id}/top-up/")
    two = client.post(
        f"{ADMIN}/billingaccount/",
        {"action": "top_up", "_selected_action": [account.id, other.id]},
    )
    assert not two["Location"].endswith("/top-up/")


def test_the_account_form_sets_mode_and_alerts_never_the_balance(client, operator):
    tenant = make_tenant()
    response = client.post(
        f"{ADMIN}/billingaccount/add/",
        {
            "tenant": tenant.id,
            "mode": BillingMode.PREPAID,
            "low_balance_threshold": "1.5",
            "notify_email": "",
            "webhook_url": "https://hooks.example.com/x",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    account = BillingAccount.objects.get(tenant=tenant)
    top_up(tenant_id=tenant.id, amount=Decimal("3"), actor="test")
    response = client.post(
        f"{ADMIN}/billingaccount/{account.id}/change/",
        {
            "mode": BillingMode.POSTPAID,
            "balance": "999",
            "low_balance_threshold": "",
            "notify_email": "",
            "webhook_url": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    account.refresh_from_db()
    assert (account.mode, account.balance, account.low_balance_threshold) == (
        BillingMode.POSTPAID,
        Decimal("3"),
        None,
    )


# Budgets ---------------------------------------------------------------------------------------


def test_budgets_are_set_through_budget_set_for_the_tenant_or_one_of_its_keys(client, operator):
    tenant = make_tenant()
    key, _ = make_api_key(tenant)
    foreign, _ = make_api_key(make_tenant())
    form = {"tenant": tenant.id, "period": "day", "amount": "0.000001", "hard": "on"}
    refused = client.post(f"{ADMIN}/budget/add/", {**form, "api_key": foreign.id})
    assert refused.status_code == 200 and not Budget.objects.exists()
    # An operator's budget binds the tenant's owners unless unticked.
    blank = client.get(f"{ADMIN}/budget/add/").content.decode()
    assert re.search(r'<input type="checkbox" name="locked"[^>]* checked', blank)
    response = client.post(f"{ADMIN}/budget/add/", {**form, "api_key": key.id, "locked": "on"})
    assert response.status_code == 302, response.content.decode()[:3000]
    budget = Budget.objects.get()
    assert (budget.api_key_id, budget.amount, budget.hard) == (key.id, Decimal("0.000001"), True)
    assert budget.locked

    page = client.get(f"{ADMIN}/budget/{budget.id}/change/").content.decode()
    assert "Spent this period" in page
    changed = client.post(f"{ADMIN}/budget/{budget.id}/change/", {"amount": "5", "period": "week"})
    assert changed.status_code == 302
    budget.refresh_from_db()
    assert (budget.amount, budget.hard, budget.period, budget.locked) == (
        Decimal(5),
        False,
        "day",
        False,
    )
    budget_set(tenant_id=tenant.id, api_key_id=key.id, period="day", amount=Decimal(1), locked=True)
    # Operators remove a locked budget as any other.
    client.post(f"{ADMIN}/budget/{budget.id}/delete/", {"post": "yes"})
    assert not Budget.objects.exists()


# Redemption codes ------------------------------------------------------------------------------


def test_a_batchs_codes_are_shown_once_as_a_page_and_csv_and_they_redeem(client, operator):
    page = client.get(f"{ADMIN}/redemptionbatch/add/")
    form = {
        "face_value": "1.500000",
        "count": "3",
        "expires_at_0": "",
        "expires_at_1": "",
        "note": "meetup",
        "once": once_of(page),
    }
    shown = client.post(f"{ADMIN}/redemptionbatch/add/", form)
    assert shown.status_code == 200
    assert "no-store" in shown["Cache-Control"]
    text = shown.content.decode()
    codes = sorted(set(CODE.findall(text)))
    assert len(codes) == 3
    batch = RedemptionBatch.objects.get()
    assert (batch.count, batch.face_value, batch.created_by) == (
        3,
        Decimal("1.5"),
        operator.get_username(),
    )
    encoded = re.search(r'href="data:text/csv;charset=utf-8;base64,([^"]+)"', text).group(1)
    rows = list(csv.reader(io.StringIO(base64.b64decode(encoded).decode())))
    assert rows[0] == ["code", "face_value", "currency", "expires_at", "batch"]
    assert sorted(row[0] for row in rows[1:]) == codes
    assert {row[1] for row in rows[1:]} == {"1.500000"}

    stored = set(RedemptionCode.objects.values_list("code_hash", flat=True))
    assert not stored & set(codes)
    resent = client.post(f"{ADMIN}/redemptionbatch/add/", form)
    assert resent.status_code == 302 and RedemptionBatch.objects.count() == 1
    later = [
        client.get(f"{ADMIN}/redemptionbatch/").content.decode(),
        client.get(f"{ADMIN}/redemptionbatch/{batch.id}/change/").content.decode(),
        client.get(f"{ADMIN}/redemptioncode/?batch__id__exact={batch.id}").content.decode(),
    ]
    assert not any(code in page for code in codes for page in later)

    tenant = make_tenant()
    for code in codes:
        assert redeem(tenant_id=tenant.id, code=code).amount == Decimal("1.5")
    assert account_of(tenant.id).balance == Decimal("4.5")
    assert "3" in client.get(f"{ADMIN}/redemptionbatch/").content.decode()


def test_a_batch_form_refuses_what_cannot_be_a_batch(client, operator):
    page = client.get(f"{ADMIN}/redemptionbatch/add/")
    past = timezone.now() - timedelta(days=1)
    for bad in (
        {"count": "0"},
        {"count": "10001"},
        {"face_value": "0"},
        {"face_value": "0.0000001"},
        {"expires_at_0": past.strftime("%Y-%m-%d"), "expires_at_1": "00:00:00"},
    ):
        form = {
            "face_value": "1",
            "count": "1",
            "expires_at_0": "",
            "expires_at_1": "",
            "note": "",
            "once": once_of(page),
            **bad,
        }
        response = client.post(f"{ADMIN}/redemptionbatch/add/", form)
        assert response.status_code == 200, bad
        assert "errorlist" in response.content.decode(), bad
    assert not RedemptionBatch.objects.exists()


# The keys' pages: cost on usage, the plan's multiplier, a tenant's money ----------------------


def test_usage_pages_show_cached_tokens_and_cost_and_tenants_their_money(client, operator):
    key, _ = make_api_key()
    record_usage(key, model="admin-cost", cached_tokens=33, cost_micros=1_000_001)
    records = client.get("/admin/billing/usagerecord/").content.decode()
    assert "column-cost" in records and "1.000001" in records
    assert "column-cached_tokens" in records
    daily = client.get("/admin/billing/usagedaily/").content.decode()
    assert "column-cost" in daily and "1.000001" in daily

    Plan.objects.create(name="discounted", price_multiplier=Decimal("0.8"))
    assert "column-price_multiplier" in client.get("/admin/keys/plan/").content.decode()

    top_up(tenant_id=key.tenant_id, amount=Decimal("7.25"), actor="test")
    page = client.get(f"/admin/keys/tenant/{key.tenant_id}/change/").content.decode()
    assert "balance 7.250000 USD" in page and "1.000001 USD spent this month" in page
