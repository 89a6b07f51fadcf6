"""The issue's proof for money, in a real browser: an owner sets a budget and a webhook in the
portal, spends past 80% and 100% of it through the API (the mail and the signed webhook arrive,
once each), runs out of prepaid balance and is refused with the message, redeems a code in the
portal, and is served again; the spend and statement pages as they looked."""

from __future__ import annotations

import concurrent.futures
import re
from decimal import Decimal

import openai
import pytest
from playwright.sync_api import expect

from tests.billing.webhooks import Receiver, verified
from tests.browser.conftest import Developer
from tests.browser.test_portal import client, create_key
from tests.stack import wait_for

MODEL = "dmx-tiny"
# Micro-amounts, as the tiny model's prices make its requests (0.15 and 0.60 per million
# tokens): a short chat costs a few millionths. The balance outlasts the budget, which is soft.
BALANCE = Decimal("0.000060")
BUDGET = "0.00005"
ALERT_SECONDS = 60  # alerts run every second in the suite (scripts/test.sh); a busy machine


def off_the_browsers_thread(work):
    """Run ORM work in a thread of its own: Django refuses it beside Playwright's event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result()


def make_prepaid_with_a_code(email: str) -> tuple[int, str]:
    """The operator's part: the developer's tenant prepaid with a small balance, and a code."""
    from django.db import connection

    from apps.billing.choices import BillingMode
    from apps.billing.services import account_of, account_update, codes_generate, top_up
    from apps.keys.models import Membership

    try:
        tenant_id = Membership.objects.get(user__email=email).tenant_id
        account_update(account=account_of(tenant_id), mode=BillingMode.PREPAID)
        top_up(tenant_id=tenant_id, amount=BALANCE, actor="operator")
        _, (code,) = codes_generate(face_value=Decimal("1"), count=1, actor="operator")
        return tenant_id, code
    finally:
        connection.close()


def celery_log(platform):
    return next(s for s in platform.stack.services if "celery" in " ".join(s.argv)).log_path


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.close()


def ask(platform, secret: str):
    return client(platform, secret).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )


def test_budget_alerts_a_balance_that_runs_out_and_a_code_that_refills_it(
    platform, developer: Developer, shoot, receiver, django_db_blocker
):
    page = developer.page
    secret = create_key(page, "billing key")
    with django_db_blocker.unblock():
        _, code = off_the_browsers_thread(lambda: make_prepaid_with_a_code(developer.email))

    # The owner sets a soft monthly budget and where alerts go.
    page.goto("/billing/")
    expect(page.locator("#billing-mode")).to_have_text("Prepaid")
    page.select_option("#id_period", "month")
    page.fill("#id_amount", BUDGET)
    page.check("#id_enforcement_1")  # soft: only alert
    page.locator("#budget-form").get_by_role("button", name="Set the budget").click()
    expect(page.locator("#budgets-table")).to_contain_text("0.00005")
    page.fill("#id_webhook_url", receiver.url)
    page.locator("#alerts-form").get_by_role("button", name="Save the alerts").click()
    signing_secret = page.locator("#webhook-secret").inner_text().strip()
    assert signing_secret.startswith("whsec_")
    shoot(page, "budget-and-webhook")

    # Spend until the balance cannot cover a request: refused with the message, 429.
    served = 0
    refusal = None
    while refusal is None and served < 60:
        try:
            ask(platform, secret)
            served += 1
        except openai.RateLimitError as error:
            refusal = error
    assert refusal is not None and served > 0, f"{served} served, never refused"
    assert refusal.code == "insufficient_balance"
    assert "prepaid balance does not cover this request" in refusal.message

    # The budget passed 80% and 100%: each alert arrives once, signed, by webhook and mail.
    events = receiver.wait_for(2, timeout=ALERT_SECONDS)
    assert all(verified(signing_secret, event) for event in events)
    kinds = sorted(event.event["type"] for event in events)
    assert kinds == ["budget.reached", "budget.warning"], kinds
    log = celery_log(platform)
    mails = wait_for(
        lambda: (
            text
            if len(re.findall(rf"To: {re.escape(developer.email)}\n", text := log.read_text())) >= 2
            else None
        ),
        timeout=ALERT_SECONDS,
        what=f"two alert mails to {developer.email} in {log}",
    )
    assert "80% of the monthly budget" in mails and "100% of the monthly budget" in mails

    page.goto("/billing/")
    expect(page.locator("#budgets-table")).to_contain_text("soft")
    shoot(page, "spend")
    page.goto("/billing/statement/")
    expect(page.locator("main")).to_contain_text(MODEL)
    shoot(page, "statement")

    # A code refills the balance: served again.
    page.goto("/billing/")
    page.fill("#id_code", code)
    page.locator("#redeem-form").get_by_role("button", name="Redeem").click()
    expect(page.locator("#balance")).to_contain_text(re.compile(r"^1\.\d{2,6} USD"))
    shoot(page, "redeemed")
    assert ask(platform, secret).usage.completion_tokens > 0
    assert len(receiver.received) == 2  # nothing sent twice
    assert developer.errors == []
