"""Budget and balance alerts: once per subject and period whoever looks, by mail and by a webhook
a receiver can verify (docs/use/billing-webhooks.md), tried again after a failure; the balance
ledger check's gauge; and the counters put back after the request store lost them."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.billing.choices import BillingMode
from apps.billing.counters import balance_key, period_bounds, spend_key
from apps.billing.models import BillingAccount, Budget, Notification, UsageRecord
from apps.billing.services import (
    AlertKind,
    Charge,
    account_of,
    account_update,
    balance_seed,
    budget_set,
    notification_deliver,
    notifications_raise,
    top_up,
    usage_charges,
)
from apps.billing.tasks import (
    billing_alerts_task,
    billing_ledger_check_task,
    billing_notification_deliver_task,
)
from apps.keys.choices import MemberRole
from apps.keys.models import ApiKey, Tenant
from dmxplatform.redis_client import request_redis
from tests.billing.webhooks import WAIT_SECONDS, Receiver, verified
from tests.keys.factories import make_api_key, make_member, make_tenant, make_user

pytestmark = pytest.mark.usefixtures("private_redis")

# Long enough for a loaded machine; every wait ends as soon as its condition holds.


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    settings.DMX_WEBHOOK_ALLOW_PRIVATE = True  # the receiver listens on 127.0.0.1
    running = Receiver()
    yield running
    running.close()


def owned_tenant() -> tuple[Tenant, str]:
    """A tenant with an owner (who gets the alerts) and a member (who does not)."""
    tenant = make_tenant()
    owner = make_user(f"owner-{uuid.uuid4().hex[:8]}@example.com")
    make_member(tenant, owner, role=MemberRole.OWNER)
    make_member(tenant, make_user(), role=MemberRole.MEMBER)
    return tenant, owner.email


def spent(budget: Budget, amount: str, now: datetime | None = None) -> None:
    """What the gateways have counted against a budget this period, reservations included."""
    label = period_bounds(budget.period, now or timezone.now())[0]
    micros = int(Decimal(amount) * 1_000_000)
    request_redis().set(spend_key(budget.tenant_id, budget.id, label), micros)


def prepaid(tenant: Tenant, *, balance: str, threshold: str, **fields) -> BillingAccount:
    account_update(
        account=account_of(tenant.id),
        mode=BillingMode.PREPAID,
        low_balance_threshold=Decimal(threshold),
        **fields,
    )
    top_up(tenant_id=tenant.id, amount=Decimal(balance), actor="test")
    balance_seed(tenant.id)
    return account_of(tenant.id)


def raised(tenant: Tenant) -> list[int]:
    """The tenant's new notifications of one alert run (other tests' committed tenants may be
    in the database too)."""
    return sorted(
        Notification.objects.filter(pk__in=notifications_raise(), tenant=tenant).values_list(
            "id", flat=True
        )
    )


def mail_to(mailoutbox, address: str) -> list:
    return [mail for mail in mailoutbox if address in mail.to]


def held(tenant: Tenant, amount: str) -> None:
    """Redis's copy of the balance, as admissions and settles leave it."""
    request_redis().set(balance_key(tenant.id), int(Decimal(amount) * 1_000_000))


@pytest.mark.django_db
def test_a_budget_past_80_then_100_percent_alerts_once_each_by_mail_and_signed_webhook(
    receiver, mailoutbox, eager_celery, settings
):
    tenant, owner_email = owned_tenant()
    account = account_update(account=account_of(tenant.id), webhook_url=receiver.url)
    assert account.webhook_secret == ""  # made at the first delivery
    budget = budget_set(tenant_id=tenant.id, period="month", amount=Decimal("10"))
    now = timezone.now()
    label, start, end = period_bounds("month", now)

    spent(budget, "7.99")
    billing_alerts_task.apply()
    assert not Notification.objects.filter(tenant=tenant).exists()

    spent(budget, "8.5")
    for _ in range(3):  # beat runs it every 30 s; the alert goes once
        billing_alerts_task.apply()
    [warning] = Notification.objects.filter(tenant=tenant)
    assert (warning.kind, warning.subject, warning.period) == (
        AlertKind.BUDGET_WARNING,
        f"budget:{budget.id}",
        label,
    )
    [first] = receiver.wait_for(1)
    secret = BillingAccount.objects.get(tenant=tenant).webhook_secret
    assert secret.startswith("whsec_")
    assert verified(secret, first)
    assert not verified(secret + "x", first)
    event = first.event
    assert event["id"].startswith("evt_") and event["id"] == first.headers["X-DMX-Event-Id"]
    assert event["type"] == first.headers["X-DMX-Event"] == "budget.warning"
    assert event["tenant"] == {"id": tenant.id, "slug": tenant.slug, "name": tenant.name}
    assert (event["currency"], event["period"]) == (settings.DMX_CURRENCY, label)
    assert datetime.fromisoformat(event["created_at"]) >= now - timedelta(seconds=5)
    assert event["budget"] == {
        "id": budget.id,
        "scope": "tenant",
        "api_key": None,
        "period": "month",
        "amount": "10.000000",
        "hard": True,
        "spent": "8.500000",
        "threshold_percent": 80,
        "period_start": start.isoformat(),
        "resets_at": end.isoformat(),
    }
    assert first.headers["Content-Type"] == "application/json"
    sent_as = [name for name, _ in first.headers.items()]
    assert "X-DMX-Signature" in sent_as  # as documented, for case-minded receivers
    [mail] = mail_to(mailoutbox, owner_email)
    assert "80%" in mail.subject and "8.500000" in mail.body
    warning.refresh_from_db()
    assert warning.email_sent_at and warning.webhook_sent_at and warning.attempts == 1

    spent(budget, "10")
    billing_alerts_task.apply()
    billing_alerts_task.apply()
    kinds = sorted(Notification.objects.filter(tenant=tenant).values_list("kind", flat=True))
    assert kinds == [AlertKind.BUDGET_REACHED, AlertKind.BUDGET_WARNING]
    received = receiver.wait_for(2)
    assert len(received) == len(mail_to(mailoutbox, owner_email)) == 2
    assert received[1].event["type"] == "budget.reached"
    assert received[1].event["id"] != event["id"]
    assert verified(secret, received[1])


@pytest.mark.django_db
def test_a_key_budget_alerts_to_the_accounts_address_naming_the_key(mailoutbox, eager_celery):
    tenant, _ = owned_tenant()
    key, _ = make_api_key(tenant)
    account_update(account=account_of(tenant.id), notify_email="billing@example.com")
    budget = budget_set(tenant_id=tenant.id, api_key_id=key.id, period="day", amount=Decimal("2"))
    spent(budget, "2.000001")

    billing_alerts_task.apply()

    notes = Notification.objects.filter(tenant=tenant).order_by("kind")
    assert [n.kind for n in notes] == [AlertKind.BUDGET_REACHED, AlertKind.BUDGET_WARNING]
    assert {n.payload["budget"]["api_key"] for n in notes} == {key.key_id}
    assert {n.period for n in notes} == {period_bounds("day", timezone.now())[0]}
    mails = mail_to(mailoutbox, "billing@example.com")
    assert len(mails) == 2 and all(key.key_id in m.subject for m in mails)
    assert not [m for m in mailoutbox if tenant.name in m.subject and m not in mails]
    # No webhook URL: nothing else to send, and nothing to try again.
    assert all(n.webhook_sent_at is None and n.attempts == 1 for n in notes)


@pytest.mark.django_db
def test_the_webhook_is_tried_again_after_a_500_each_try_signed_the_mail_sent_once(
    receiver, mailoutbox
):
    tenant, owner_email = owned_tenant()
    prepaid(tenant, balance="20", threshold="10", webhook_url=receiver.url)
    held(tenant, "9.5")
    [notification_id] = raised(tenant)
    receiver.statuses.append(500)

    # Celery runs the retry at once when the task is applied in-process (the countdown is the
    # worker's to wait).
    billing_notification_deliver_task.apply(args=[notification_id])

    first, second = receiver.wait_for(2)
    secret = BillingAccount.objects.get(tenant=tenant).webhook_secret
    assert verified(secret, first) and verified(secret, second)
    assert first.event == second.event  # the same event, its id for the receiver to dedupe
    assert second.event["type"] == "balance.low"
    assert second.event["balance"] == {"amount": "9.500000", "threshold": "10.000000"}
    notification = Notification.objects.get(pk=notification_id)
    assert notification.attempts == 2 and notification.webhook_sent_at is not None
    assert len(mail_to(mailoutbox, owner_email)) == 1  # mailed on the first try only
    assert len(receiver.received) == 2


@pytest.mark.django_db
def test_delivery_backs_off_doubling_and_gives_up_after_the_attempts(receiver, settings):
    settings.DMX_WEBHOOK_ATTEMPTS = 3
    settings.DMX_WEBHOOK_BACKOFF_SECONDS = 7
    tenant, _ = owned_tenant()
    prepaid(tenant, balance="1", threshold="5", webhook_url=receiver.url)
    [notification_id] = raised(tenant)
    receiver.statuses.extend([500, 503, 502, 200])

    tries = [notification_deliver(notification_id=notification_id) for _ in range(3)]

    assert [t.retry_in for t in tries] == [7, 14, None]
    assert not any(t.delivered for t in tries)
    assert len(receiver.wait_for(3)) == 3
    notification = Notification.objects.get(pk=notification_id)
    assert notification.webhook_sent_at is None and notification.attempts == 3


@pytest.mark.django_db
def test_a_webhook_to_the_platforms_own_network_is_refused(receiver, mailoutbox, settings):
    settings.DMX_WEBHOOK_ALLOW_PRIVATE = False  # the default: only public addresses
    tenant, owner_email = owned_tenant()
    prepaid(tenant, balance="1", threshold="5", webhook_url=receiver.url)
    [notification_id] = raised(tenant)
    delivery = notification_deliver(notification_id=notification_id)
    assert not delivery.delivered and delivery.retry_in is not None
    assert receiver.received == []  # nothing reached the loopback listener
    assert len(mail_to(mailoutbox, owner_email)) == 1  # the mail still went


@pytest.mark.django_db
def test_a_name_that_rebinds_to_the_platforms_network_is_not_followed(
    receiver, mailoutbox, settings, monkeypatch
):
    """DNS rebinding: the tenant's name answers a public address to the check, then the
    loopback address the receiver listens on. The connection goes to the address checked.
    (DNS is a stand-in here: no resolver this test controls answers for a public name.)"""
    settings.DMX_WEBHOOK_ALLOW_PRIVATE = False
    public = "93.184.216.34"
    real_lookup, real_connect = socket.getaddrinfo, socket.create_connection
    answers = iter([public])

    def lookup(host, port, *args, **kwargs):
        if host != "hooks.rebind.example":
            return real_lookup(host, port, *args, **kwargs)
        address = next(answers, "127.0.0.1")  # the first answer public, every later one not
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    dialled: list[tuple[str, int]] = []

    def connect(address, *args, **kwargs):
        dialled.append(address)
        if address[0] == public:  # no route out of here: refused, as a closed port would be
            raise ConnectionRefusedError(f"{address} unreachable")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket, "create_connection", connect)
    tenant, _ = owned_tenant()
    url = receiver.url.replace("127.0.0.1", "hooks.rebind.example")
    prepaid(tenant, balance="1", threshold="5", webhook_url=url)
    [notification_id] = raised(tenant)
    delivery = notification_deliver(notification_id=notification_id)
    assert not delivery.delivered and delivery.retry_in is not None
    assert dialled == [(public, int(url.rsplit(":", 1)[1].split("/")[0]))]
    assert receiver.received == []


@pytest.mark.django_db
def test_a_webhook_url_with_a_bad_port_fails_its_delivery_not_the_task(mailoutbox):
    tenant, owner_email = owned_tenant()
    prepaid(tenant, balance="1", threshold="5", webhook_url="https://hooks.example.com:99999/x")
    [notification_id] = raised(tenant)
    delivery = notification_deliver(notification_id=notification_id)
    assert not delivery.delivered and delivery.retry_in is not None
    assert Notification.objects.get(pk=notification_id).email_sent_at is not None
    assert len(mail_to(mailoutbox, owner_email)) == 1


@pytest.mark.django_db
def test_a_balance_alerts_once_per_dip_below_the_threshold():
    tenant = make_tenant()
    account = prepaid(tenant, balance="20", threshold="10")
    first_top_up = account.movements.get().id

    held(tenant, "10")
    assert raised(tenant) == []  # at the threshold is not below it
    held(tenant, "9")
    [dip] = raised(tenant)
    assert Notification.objects.get(pk=dip).period == f"c{first_top_up}"
    assert raised(tenant) == []
    # The flush stores the charges Redis's copy took at settle, the first leaving the
    # database's balance above the threshold for a while: still the same dip.
    usage_charges([Charge(tenant.id, f"req-{uuid.uuid4().hex}", 5_000_000)])
    assert raised(tenant) == []
    usage_charges([Charge(tenant.id, f"req-{uuid.uuid4().hex}", 6_000_000)])
    request_redis().delete(balance_key(tenant.id))  # the database's balance (9) is read now
    assert raised(tenant) == []
    balance_seed(tenant.id)
    # A credit that leaves it below does not start a new dip.
    top_up(tenant_id=tenant.id, amount=Decimal("0.5"), actor="test")
    assert raised(tenant) == []

    lift = top_up(tenant_id=tenant.id, amount=Decimal("5"), actor="test")  # 14.5
    assert raised(tenant) == []
    held(tenant, "3")
    [second_dip] = raised(tenant)
    assert Notification.objects.get(pk=second_dip).period == f"c{lift.id}"

    # An owner who raises the threshold above the balance hears at once.
    account_update(account=account_of(tenant.id), low_balance_threshold=Decimal("50"))
    [higher] = raised(tenant)
    note = Notification.objects.get(pk=higher)
    assert note.subject == "balance:50.000000" and note.payload["balance"]["amount"] == "3.000000"
    assert raised(tenant) == []


@pytest.mark.django_db
def test_postpaid_accounts_and_zero_budgets_do_not_alert():
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), low_balance_threshold=Decimal("10"))
    budget = budget_set(tenant_id=tenant.id, period="week", amount=Decimal("0"))
    spent(budget, "1")
    assert raised(tenant) == []


def _at_once(workers: int, work: Callable[[], list[int]]) -> tuple[list[list[int]], list]:
    """Run `work` in threads released together; (each one's result, the errors)."""
    start = threading.Barrier(workers)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait(WAIT_SECONDS)
            results.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    return results, errors


@pytest.mark.django_db(transaction=True)
def test_workers_raising_and_delivering_at_once_send_each_alert_once(receiver, mailoutbox):
    tenant, owner_email = owned_tenant()
    account_update(account=account_of(tenant.id), webhook_url=receiver.url)
    budget = budget_set(tenant_id=tenant.id, period="month", amount=Decimal("4"))
    spent(budget, "4.5")  # past both levels

    results, errors = _at_once(6, notifications_raise)

    assert errors == []
    rows = Notification.objects.filter(tenant=tenant)
    mine = set(rows.values_list("id", flat=True))
    new = [
        notification_id for found in results for notification_id in found if notification_id in mine
    ]
    assert len(new) == len(set(new)) == len(mine) == 2  # each made by one worker only

    for notification_id in new:
        deliveries, errors = _at_once(
            4, lambda nid=notification_id: [notification_deliver(notification_id=nid)]
        )
        assert errors == []
        assert any(delivery.delivered for [delivery] in deliveries)
    received = receiver.wait_for(2)
    assert sorted(r.event["type"] for r in received) == ["budget.reached", "budget.warning"]
    assert len(mail_to(mailoutbox, owner_email)) == 2
    assert len(receiver.received) == 2


def _scrape() -> str:
    reply = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert reply.status_code == 200
    return reply.content.decode()


def _sample(page: str, name: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


@pytest.mark.django_db
def test_the_ledger_check_finds_a_corrupted_balance_and_metrics_say_so():
    tenant = make_tenant()
    top_up(tenant_id=tenant.id, amount=Decimal("2"), actor="ops")
    before = time.time()
    # 0 in this test's own database; other tests' committed accounts may be there too.
    wrong = billing_ledger_check_task.apply().get()
    assert _sample(_scrape(), "dmx_balance_ledger_mismatches") == wrong

    # Corrupted behind the services' back.
    BillingAccount.objects.filter(tenant=tenant).update(balance=Decimal("3"))
    assert billing_ledger_check_task.apply().get() == wrong + 1

    page = _scrape()  # what a gateway's /metrics shows: the check ran in a Celery worker
    assert _sample(page, "dmx_balance_ledger_mismatches") == wrong + 1
    assert _sample(page, "dmx_balance_ledger_checked_timestamp_seconds") >= int(before)

    BillingAccount.objects.filter(tenant=tenant).update(balance=Decimal("2"))
    billing_ledger_check_task.apply()
    assert _sample(_scrape(), "dmx_balance_ledger_mismatches") == wrong


@pytest.mark.django_db
def test_a_shortfall_counted_by_the_flush_reaches_metrics():
    tenant = make_tenant()
    account_update(account=account_of(tenant.id), mode=BillingMode.PREPAID)
    top_up(tenant_id=tenant.id, amount=Decimal("1"), actor="ops")
    before = _sample(_scrape(), "dmx_balance_shortfall_total")

    usage_charges([Charge(tenant.id, f"req-{uuid.uuid4().hex}", 1_250_000)])

    assert _sample(_scrape(), "dmx_balance_shortfall_total") == pytest.approx(before + 0.25)
    assert account_of(tenant.id).balance == 0


def _record(key: ApiKey, when: datetime, cost: str) -> None:
    UsageRecord.objects.create(
        request_id=f"req_{uuid.uuid4().hex}",
        api_key=key,
        tenant=key.tenant,
        created_at=when,
        endpoint="chat.completions",
        model="m",
        status="ok",
        http_status=200,
        cost=Decimal(cost),
    )


def _counter(budget: Budget) -> int | None:
    label = period_bounds(budget.period, timezone.now())[0]
    raw = request_redis().get(spend_key(budget.tenant_id, budget.id, label))
    return None if raw is None else int(raw)


@pytest.mark.django_db
def test_rebuilding_counters_adds_the_spend_before_the_loss_once_and_drops_balance_copies():
    tenant = make_tenant()
    key, _ = make_api_key(tenant)
    other_key, _ = make_api_key(tenant)
    whole = budget_set(tenant_id=tenant.id, period="month", amount=Decimal("100"))
    week = budget_set(tenant_id=tenant.id, period="week", amount=Decimal("100"))
    daily = budget_set(tenant_id=tenant.id, api_key_id=key.id, period="day", amount=Decimal("50"))
    since = timezone.now()  # when the request store came back empty
    _, day_start, _ = period_bounds("day", since)
    month_start = period_bounds("month", since)[1]
    week_start = period_bounds("week", since)[1]
    _record(key, day_start + (since - day_start) / 4, "1.5")
    _record(other_key, day_start + (since - day_start) / 2, "2.25")
    _record(key, since, "4")  # after the loss: the gateways counted it already
    _record(key, min(month_start, week_start) - timedelta(seconds=1), "100")  # an earlier period
    spent(whole, "4")
    spent(daily, "4")  # the week's counter was not written since
    account = prepaid(make_tenant(), balance="5", threshold="1")
    held(account.tenant, "123")  # a copy seeded before the replayed charges were stored

    call_command("billing_rebuild_counters", "--since", since.isoformat(), "--dry-run")
    assert (_counter(whole), _counter(week), _counter(daily)) == (4_000_000, None, 4_000_000)
    assert request_redis().get(balance_key(account.tenant_id)) is not None

    for _ in range(2):  # a second run adds nothing
        call_command("billing_rebuild_counters", "--since", since.isoformat())
        assert _counter(whole) == 7_750_000
        assert _counter(week) == 3_750_000
        assert _counter(daily) == 5_500_000
    label = period_bounds("week", since)[0]
    assert request_redis().pttl(spend_key(tenant.id, week.id, label)) > 0
    assert request_redis().get(balance_key(account.tenant_id)) is None
    assert balance_seed(account.tenant_id) == 5_000_000
