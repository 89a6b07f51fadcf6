"""The portal's money pages: billing (balance, movements, budgets, redemption, alerts), the
monthly statement and its CSV, the public price list, and cost on the usage page and its CSV."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from apps.billing.choices import BillingMode, BudgetPeriod, MovementKind
from apps.billing.counters import period_bounds, spend_key
from apps.billing.models import BalanceMovement, BillingAccount, Budget, UsageRecord
from apps.billing.money import to_micros
from apps.billing.services import (
    account_of,
    account_update,
    budget_set,
    codes_generate,
    price_set,
    top_up,
)
from apps.portal import statements
from apps.portal.templatetags.money import FIGURE_SPACE, aligned_text, amount_text, money_text
from dmxplatform.redis_client import request_redis
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.portal.conftest import make_record, table

pytestmark = pytest.mark.usefixtures("private_redis")

CURRENCY = "EUR"  # not the default, so that a page that ignores the setting shows


@pytest.fixture(autouse=True)
def _currency(settings):
    settings.DMX_CURRENCY = CURRENCY


def _html(response) -> str:
    return response.content.decode()


def _read(response) -> list[list[str]]:
    """A streamed CSV's rows, read as an ASGI server reads it."""

    async def body() -> str:
        return "".join([chunk.decode() async for chunk in response.streaming_content])

    return list(csv.reader(io.StringIO(async_to_sync(body)())))


def _rows(html: str, table_id: str) -> list[str]:
    """The table's body rows, without the figure spaces that align amounts."""
    body = table(html, table_id).replace(FIGURE_SPACE, "")
    body = body[body.index("<tbody>") : body.index("</tbody>")]
    return re.findall(r"<tr[\s>].*?</tr>", body, flags=re.S)


# --- money as text -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("1234.5"), "1,234.50"),
        (Decimal("0.000125"), "0.000125"),
        (Decimal("12.500000"), "12.50"),
        (Decimal("0"), "0.00"),
        (Decimal("-3.25"), "-3.25"),
        (Decimal("1E+3"), "1,000.00"),
    ],
)
def test_amounts_are_exact_decimals(value, text):
    assert amount_text(value) == text
    assert money_text(value) == f"{text} {CURRENCY}"


def test_aligned_amounts_pad_to_six_places():
    assert aligned_text(Decimal("1.5")) == "1.50" + FIGURE_SPACE * 4
    assert aligned_text(Decimal("-0.000172")) == "-0.000172"


def test_a_float_is_refused_as_money():
    with pytest.raises(TypeError):
        money_text(0.1)


# --- billing page: budgets ------------------------------------------------------------------


def _set_budget(person, **fields):
    data = {"applies_to": "", "period": "month", "amount": "25.50", "enforcement": "hard"}
    return person.client.post(reverse("portal:billing_budget_set"), {**data, **fields})


def test_an_owner_sets_budgets_for_the_tenant_and_a_key(owner):
    key, _ = make_api_key(owner.tenant, name="prod")

    assert _set_budget(owner).status_code == 302
    response = _set_budget(
        owner, applies_to=key.key_id, period="day", amount="0.000500", enforcement="soft"
    )
    assert response.status_code == 302

    tenant_wide = Budget.objects.get(tenant=owner.tenant, api_key=None)
    assert (tenant_wide.period, tenant_wide.amount, tenant_wide.hard) == (
        BudgetPeriod.MONTH,
        Decimal("25.5"),
        True,
    )
    per_key = Budget.objects.get(tenant=owner.tenant, api_key=key)
    assert (per_key.period, per_key.amount, per_key.hard) == (
        BudgetPeriod.DAY,
        Decimal("0.0005"),
        False,
    )
    # The same scope and period again changes the budget, it makes no second one.
    assert _set_budget(owner, amount="30").status_code == 302
    assert Budget.objects.get(pk=tenant_wide.pk).amount == Decimal(30)
    assert Budget.objects.filter(tenant=owner.tenant).count() == 2

    budgets = table(_html(owner.client.get(reverse("portal:billing"))), "budgets-table")
    assert f"30.00 {CURRENCY}" in budgets and f"0.0005 {CURRENCY}" in budgets
    assert "the whole tenant" in budgets and "prod" in budgets


def test_a_budget_shows_its_spend_this_period(owner):
    budget = budget_set(tenant_id=owner.tenant.id, period="week", amount=Decimal("25.50"))
    label, _, resets_at = period_bounds("week", timezone.now())
    request_redis().set(
        spend_key(owner.tenant.id, budget.id, label), to_micros(Decimal("10.200000"))
    )

    html = _html(owner.client.get(reverse("portal:billing")))
    (row,) = _rows(html, "budgets-table")
    assert f"10.20 {CURRENCY}" in row and f"25.50 {CURRENCY}" in row
    assert "40%" in row and 'style="width: 40%"' in row  # 10.20 / 25.50
    assert f"{resets_at:%Y-%m-%d %H:%M}" in row


def test_a_member_cannot_set_or_remove_budgets(owner, member):
    budget_set(tenant_id=owner.tenant.id, period="month", amount=Decimal(5))

    assert _set_budget(member, amount="999").status_code == 403
    budget = Budget.objects.get(tenant=owner.tenant)
    assert budget.amount == Decimal(5)
    delete = reverse("portal:billing_budget_delete", args=[budget.id])
    assert member.client.post(delete).status_code == 403
    assert Budget.objects.filter(pk=budget.pk).exists()

    html = _html(member.client.get(reverse("portal:billing")))
    assert f"5.00 {CURRENCY}" in table(html, "budgets-table")  # members see the budgets
    assert 'id="budget-form"' not in html and 'id="budgets-read-only"' in html
    assert delete not in html


def test_an_owner_removes_a_budget_after_confirming(owner, stranger):
    budget = budget_set(tenant_id=owner.tenant.id, period="day", amount=Decimal(5))
    delete = reverse("portal:billing_budget_delete", args=[budget.id])
    # Another tenant's budget is not found, not forbidden.
    assert stranger.client.get(delete).status_code == 404
    assert stranger.client.post(delete).status_code == 404

    confirm = owner.client.get(delete)
    assert confirm.status_code == 200 and f"5.00 {CURRENCY}" in _html(confirm)
    assert Budget.objects.filter(pk=budget.pk).exists()
    assert owner.client.post(delete).status_code == 302
    assert not Budget.objects.filter(pk=budget.pk).exists()


def test_a_budget_the_operators_set_is_shown_and_kept_from_the_owners(owner):
    budget = budget_set(tenant_id=owner.tenant.id, period="month", amount=Decimal(5), locked=True)
    delete = reverse("portal:billing_budget_delete", args=[budget.id])
    html = _html(owner.client.get(reverse("portal:billing")))
    (row,) = _rows(html, "budgets-table")
    assert "set by the operator" in row and delete not in row

    refused = _set_budget(owner, amount="999")
    assert refused.status_code == 400
    assert "set by the platform&#x27;s operators" in _html(refused)
    followed = owner.client.post(delete, follow=True)
    assert "set by the platform&#x27;s operators" in _html(followed)
    budget.refresh_from_db()
    assert budget.amount == Decimal(5)
    # A budget of the owners' own beside it, for another period.
    assert _set_budget(owner, period="day", amount="1").status_code == 302
    assert Budget.objects.filter(tenant=owner.tenant).count() == 2


@pytest.mark.parametrize(
    "fields",
    [{"amount": "-1"}, {"amount": "1.0000001"}, {"period": "year"}, {"enforcement": "maybe"}],
)
def test_a_bad_budget_is_a_400_with_the_form(owner, fields):
    response = _set_budget(owner, **fields)
    assert response.status_code == 400
    html = _html(response)
    assert 'id="budget-form"' in html and "errorlist" in html
    assert not Budget.objects.filter(tenant=owner.tenant).exists()


def test_another_tenants_key_gets_no_budget(owner, stranger):
    theirs, _ = make_api_key(stranger.tenant)
    response = _set_budget(owner, applies_to=theirs.key_id)
    assert response.status_code == 400
    assert not Budget.objects.exists()


# --- billing page: balance, movements, redemption -------------------------------------------


def _redeem(person, code: str):
    return person.client.post(reverse("portal:billing_redeem"), {"code": code})


def test_a_code_credits_the_balance_once(owner, member):
    _, (code,) = codes_generate(face_value=Decimal("12.50"), count=1)

    response = _redeem(member, code)  # members redeem too
    assert response.status_code == 302
    page = member.client.get(response["Location"])
    html = _html(page)
    assert f"12.50 {CURRENCY} credited" in html
    assert f'<span class="stat-value" id="balance">12.50 {CURRENCY}</span>' in html
    (row,) = _rows(html, "movements-table")
    assert "Redemption code" in row and "+12.50</td>" in row and code[-4:] in row

    # Again, by anyone, in any spelling: refused with the reason, nothing credited.
    for again in (code, code.lower().replace("-", "")):
        second = _redeem(owner, again)
        assert second.status_code == 400
        assert "This code was already redeemed." in _html(second)
    account = BillingAccount.objects.get(tenant=owner.tenant)
    assert account.balance == Decimal("12.50")
    assert list(BalanceMovement.objects.filter(account=account).values_list("kind", "amount")) == [
        (MovementKind.REDEMPTION, Decimal("12.50"))
    ]


def test_a_code_that_is_not_one_says_so(owner):
    response = _redeem(owner, "DMX-0000-0000-0000-0000-0000")
    assert response.status_code == 400
    html = _html(response)
    assert "This code is not valid." in html and 'id="redeem-form"' in html
    assert not BalanceMovement.objects.exists()


def test_without_redis_the_billing_page_and_a_redemption_ask_for_a_retry(owner, settings):
    store = settings.DMX_REQUEST_REDIS_URL
    # The request store at a port nothing listens on (1): every live figure and every credit
    # fails as it would with Redis down.
    settings.DMX_REQUEST_REDIS_URL = "redis://127.0.0.1:1/0"
    budget_set(tenant_id=owner.tenant.id, period="month", amount=Decimal(5))
    page = owner.client.get(reverse("portal:billing"))
    assert page.status_code == 503 and page["Retry-After"] == "2"
    html = _html(page)
    assert 'id="store-unavailable"' in html and f'href="{reverse("portal:billing")}"' in html

    _, (code,) = codes_generate(face_value=Decimal("12.50"), count=1)
    billing = "http://testserver" + reverse("portal:billing")
    refused = owner.client.post(
        reverse("portal:billing_redeem"), {"code": code}, headers={"referer": billing}
    )
    assert refused.status_code == 503 and f'href="{billing}"' in _html(refused)
    # Nothing was credited: the code is still good once Redis is back.
    assert not BalanceMovement.objects.exists()
    settings.DMX_REQUEST_REDIS_URL = store
    assert _redeem(owner, code).status_code == 302
    assert BillingAccount.objects.get(tenant=owner.tenant).balance == Decimal("12.50")


def test_an_expired_code_says_so(owner):
    _, (code,) = codes_generate(
        face_value=Decimal(1), count=1, expires_at=timezone.now() - timedelta(minutes=1)
    )
    response = _redeem(owner, code)
    assert response.status_code == 400 and "This code has expired." in _html(response)


def test_a_prepaid_account_shows_its_mode_and_pages_its_movements(owner):
    account_update(account=account_of(owner.tenant.id), mode=BillingMode.PREPAID)
    for n in range(30):
        top_up(tenant_id=owner.tenant.id, amount=Decimal("1.000001"), actor="op", key=f"t{n}")

    html = _html(owner.client.get(reverse("portal:billing")))
    assert '<span class="stat-value" id="billing-mode">Prepaid</span>' in html
    assert f'id="balance">30.00003 {CURRENCY}</span>' in html  # 30 x 1.000001, exactly
    first = _rows(html, "movements-table")
    assert len(first) == 25 and "Page 1 of 2" in html
    # The link to the older page works from a redemption's reply too (another URL).
    assert f'href="{reverse("portal:billing")}?page=2#movements-table"' in html
    assert "30.00003</td>" in first[0]  # newest first: its balance after

    second = _rows(
        _html(owner.client.get(reverse("portal:billing"), {"page": 2})), "movements-table"
    )
    assert len(second) == 5 and "+1.000001</td>" in second[-1]


def test_a_tenant_sees_only_its_own_balance(owner, stranger):
    top_up(tenant_id=stranger.tenant.id, amount=Decimal("77.77"), actor="op")
    html = _html(owner.client.get(reverse("portal:billing")))
    assert f'id="balance">0.00 {CURRENCY}' in html and "77.77" not in html


# --- billing page: alerts -----------------------------------------------------------------


def test_an_owner_sets_the_alerts_and_a_member_reads_them(owner, member):
    response = owner.client.post(
        reverse("portal:billing_alerts"),
        {
            "low_balance_threshold": "2.5",
            "notify_email": "",
            "webhook_url": "https://hooks.example.com/dmx",
        },
    )
    assert response.status_code == 302
    account = BillingAccount.objects.get(tenant=owner.tenant)
    assert account.low_balance_threshold == Decimal("2.5")
    assert account.webhook_url == "https://hooks.example.com/dmx"

    refused = member.client.post(
        reverse("portal:billing_alerts"),
        {"low_balance_threshold": "", "webhook_url": "https://evil.example.com/"},
    )
    assert refused.status_code == 403
    account.refresh_from_db()
    assert account.webhook_url == "https://hooks.example.com/dmx"

    html = _html(member.client.get(reverse("portal:billing")))
    assert 'id="alerts-form"' not in html
    facts = html[html.index('id="alerts-read-only"') :]
    assert f"2.50 {CURRENCY}" in facts and "https://hooks.example.com/dmx" in facts
    # The owner's form comes filled in with what is set.
    owner_html = _html(owner.client.get(reverse("portal:billing")))
    assert 'value="https://hooks.example.com/dmx"' in owner_html
    assert 'name="low_balance_threshold" value="2.5"' in owner_html


def test_a_bad_webhook_url_is_a_400(owner):
    response = owner.client.post(
        reverse("portal:billing_alerts"), {"webhook_url": "not a url at all"}
    )
    assert response.status_code == 400 and "errorlist" in _html(response)


# --- the monthly statement ------------------------------------------------------------------

MARCH = datetime(2025, 3, 1, tzinfo=UTC)


def _march_records(owner, stranger) -> list[UsageRecord]:
    """March's records of the owner's tenant, and some around it and of another tenant."""
    key, _ = make_api_key(owner.tenant, name="prod")
    other_key, _ = make_api_key(owner.tenant, name="batch")
    inside = [
        make_record(
            key,
            MARCH + timedelta(hours=1),
            model="dmx-tiny",
            prompt_tokens=1000,
            cached_tokens=600,
            completion_tokens=50,
            cost=Decimal("0.000135"),
        ),
        make_record(
            other_key,
            MARCH + timedelta(days=14),
            model="dmx-tiny",
            prompt_tokens=7,
            completion_tokens=3,
            cost=Decimal("0.000003"),
        ),
        make_record(
            key,
            MARCH + timedelta(days=31) - timedelta(seconds=1),  # 31 March, 23:59:59
            model="dmx-tiny-b",
            prompt_tokens=2_000_000,
            completion_tokens=100_000,
            cost=Decimal("1.500001"),
        ),
    ]
    make_record(key, MARCH - timedelta(seconds=1), cost=Decimal("100"))  # 28 February
    make_record(key, MARCH + timedelta(days=31), cost=Decimal("200"))  # 1 April
    theirs, _ = make_api_key(stranger.tenant)
    make_record(theirs, MARCH + timedelta(days=2), cost=Decimal("300"))
    return inside


def test_the_statement_adds_up_to_its_lines_and_the_records(owner, stranger):
    inside = _march_records(owner, stranger)
    records_cost = UsageRecord.objects.filter(
        tenant=owner.tenant, created_at__gte=MARCH, created_at__lt=datetime(2025, 4, 1, tzinfo=UTC)
    ).aggregate(total=Sum("cost"))["total"]
    assert records_cost == sum((r.cost for r in inside), Decimal(0)) == Decimal("1.500139")

    response = owner.client.get(reverse("portal:billing_statement"), {"month": "2025-03"})
    assert response.status_code == 200
    html = _html(response)
    rows = _rows(html, "statement-table")
    assert [re.search(r'data-model="([^"]+)"', row).group(1) for row in rows] == [
        "dmx-tiny",
        "dmx-tiny-b",
    ]
    line_costs = [Decimal(re.search(r'data-cost="([^"]+)"', row).group(1)) for row in rows]
    total_row = html[html.index('id="statement-total"') :]
    total = Decimal(re.search(r'data-cost="([^"]+)"', total_row).group(1))
    assert total == sum(line_costs) == records_cost
    assert f'id="statement-sum">1.500139 {CURRENCY}</strong>' in html
    tiny = rows[0]
    assert re.findall(r'<td class="num">([\d,]+)</td>', tiny) == ["2", "1,007", "600", "53"]
    assert "0.000138" in tiny


def test_the_statement_csv_adds_up_too(owner, stranger):
    _march_records(owner, stranger)
    response = owner.client.get(reverse("portal:billing_statement_export"), {"month": "2025-03"})
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    assert "statement-" in response["Content-Disposition"]
    assert "2025-03" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert list(rows[0]) == list(statements.COLUMNS) and "cost" in rows[0]
    lines = [row for row in rows if row["line"] == "model"]
    (total,) = [row for row in rows if row["line"] == "total"]
    assert [row["model"] for row in lines] == ["dmx-tiny", "dmx-tiny-b"]
    assert sum(Decimal(row["cost"]) for row in lines) == Decimal(total["cost"])
    assert Decimal(total["cost"]) == Decimal("1.500139")
    assert total["requests"] == "3" and total["cached_tokens"] == "600"
    assert {row["currency"] for row in rows} == {CURRENCY}


def test_a_prepaid_statement_shows_the_months_movements_by_kind(owner):
    account_update(account=account_of(owner.tenant.id), mode=BillingMode.PREPAID)
    top_up(tenant_id=owner.tenant.id, amount=Decimal("20"), actor="op")
    top_up(tenant_id=owner.tenant.id, amount=Decimal("0.5"), actor="op")
    _, (code,) = codes_generate(face_value=Decimal("3"), count=1)
    assert _redeem(owner, code).status_code == 302

    html = _html(owner.client.get(reverse("portal:billing_statement")))  # this month
    moved = "".join(_rows(html, "statement-movements"))
    assert re.search(r"Top-up</td><td[^>]*>\+20.50</td>", moved)
    assert re.search(r"Redemption code</td><td[^>]*>\+3.00</td>", moved)

    response = owner.client.get(reverse("portal:billing_statement_export"))
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {(r["model"], Decimal(r["cost"])) for r in rows if r["line"] == "movement"} == {
        (MovementKind.TOP_UP, Decimal("20.5")),
        (MovementKind.REDEMPTION, Decimal(3)),
    }


@pytest.mark.parametrize("month", ["March", "2025-13", "2025-03-01", "0001-01", "9999-12"])
def test_a_bad_month_is_a_400_with_the_form(owner, month):
    response = owner.client.get(reverse("portal:billing_statement"), {"month": month})
    assert response.status_code == 400
    assert 'id="month-form"' in _html(response) and "errorlist" in _html(response)
    csv_response = owner.client.get(reverse("portal:billing_statement_export"), {"month": month})
    assert csv_response.status_code == 400


def test_a_statement_shows_only_the_tenants_own_usage(owner, stranger):
    _march_records(owner, stranger)
    html = _html(stranger.client.get(reverse("portal:billing_statement"), {"month": "2025-03"}))
    assert f'id="statement-sum">300.00 {CURRENCY}</strong>' in html
    assert "dmx-tiny-b" not in html


# --- usage: cost and cached tokens ------------------------------------------------------------


def test_the_usage_csv_has_cost_and_cached_tokens(owner):
    key, _ = make_api_key(owner.tenant)
    make_record(
        key,
        datetime(2025, 3, 10, 12, tzinfo=UTC),
        request_id="req_costly",
        prompt_tokens=40,
        cached_tokens=32,
        cost=Decimal("0.12"),
    )
    response = owner.client.get(
        reverse("portal:usage_export"), {"since": "2025-03-10", "until": "2025-03-10"}
    )
    header, row = _read(response)
    record = dict(zip(header, row, strict=True))
    assert "cost" in header and "cached_tokens" in header
    assert (record["request_id"], record["cost"], record["cached_tokens"]) == (
        "req_costly",
        "0.120000",  # the stored decimal, six places, as written: no float on the way
        "32",
    )
    assert record["currency"] == CURRENCY


def test_the_usage_page_shows_cost_per_day_and_key(owner):
    key, _ = make_api_key(owner.tenant, name="prod")
    now = timezone.now()
    make_record(key, now, model="dmx-tiny", cached_tokens=4, cost=Decimal("0.250001"))
    make_record(key, now, model="dmx-tiny-b", cached_tokens=1, cost=Decimal("1.000002"))

    html = _html(owner.client.get(reverse("portal:usage")))
    totals = html[html.index('id="usage-totals"') :]
    assert f"<strong>1.250003 {CURRENCY}</strong>" in totals[: totals.index("</p>")]
    (by_key,) = _rows(html, "usage-by-key")
    assert ">1.250003</td>" in by_key and ">5</td>" in by_key
    today = _rows(html, "daily-table")[0]
    assert today.endswith('<td class="num">5</td><td class="num">1.250003</td></tr>')
    data = re.search(r'<script id="usage-data" type="application/json">(.*?)</script>', html)
    assert '"cost_by_model"' in data.group(1) and '"0.250001"' in data.group(1)
    assert 'id="cost-chart"' in html


# --- prices ---------------------------------------------------------------------------------


def test_the_price_list_shows_priced_models_to_anyone(owner, client):
    _, version = make_model("dmx-priced", prices=("1.250000", "0.500000", "5.000000"))
    make_model("dmx-unpriced", prices=None)
    later = timezone.now() + timedelta(days=3)
    price_set(
        model_version_id=version.id,
        input_per_million=Decimal(2),
        cached_input_per_million=Decimal(1),
        output_per_million=Decimal(8),
        effective_from=later,
    )

    for viewer in (client, owner.client):  # signed in or not
        response = viewer.get(reverse("portal:prices"))
        assert response.status_code == 200
        html = _html(response)
        (row,) = [r for r in _rows(html, "prices-table") if 'data-model="dmx-priced"' in r]
        assert f"1.25 {CURRENCY}" in row and f"0.50 {CURRENCY}" in row
        assert f"5.00 {CURRENCY}" in row
        assert f"from {later:%Y-%m-%d %H:%M}" in row
        assert f"input 2.00, cached 1.00, output 8.00 {CURRENCY}" in row
        assert "dmx-unpriced" not in html


def test_owners_see_the_webhook_signing_secret_and_members_do_not(owner, member):
    html = _html(owner.client.get(reverse("portal:billing")))
    assert 'id="webhook-secret"' not in html  # no webhook, no secret
    account_update(account=account_of(owner.tenant.id), webhook_url="https://hooks.example.com/")

    response = owner.client.get(reverse("portal:billing"))
    secret = BillingAccount.objects.get(tenant=owner.tenant).webhook_secret
    assert secret.startswith("whsec_")
    assert f'<code id="webhook-secret" class="secret">{secret}</code>' in _html(response)
    assert "no-store" in response["Cache-Control"]
    # Shown again, the same one.
    assert secret in _html(owner.client.get(reverse("portal:billing")))

    assert secret not in _html(member.client.get(reverse("portal:billing")))


def test_the_usage_page_counts_the_tenants_stored_responses_only(owner, stranger):
    from apps.gateway.models import StoredResponse

    now = timezone.now()
    for tenant, name, size in (
        (owner.tenant, "resp_a", 1500),
        (owner.tenant, "resp_b", 1000),
        (stranger.tenant, "resp_c", 10**6),  # another tenant's
        (owner.tenant, "resp_gone", 10**6),  # past its retention
    ):
        StoredResponse.objects.create(
            id=name, tenant=tenant, created_at=now, model="m", status="completed",
            expires_at=now + (timedelta(days=-1) if name == "resp_gone" else timedelta(days=30)),
            response={"id": name}, size_bytes=size,
        )  # fmt: skip
    html = _html(owner.client.get(reverse("portal:usage")))
    stored = html[html.index('id="stored-responses"') :]
    stored = stored[: stored.index("</p>")]
    assert "2 responses" in stored and "2.4\xa0KB" in stored and "30 days" in stored
