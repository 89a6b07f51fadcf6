"""Budget and balance alerts: found, recorded once per subject and period, delivered by mail and
by a signed webhook (docs/use/billing-webhooks.md).

Found: budgets past DMX_BUDGET_ALERT_PERCENT and past 100% of their amount this period, from the
spend counters the gateways check (requests in flight count at what they may cost), and prepaid
balances below their account's low_balance_threshold (Redis's copy, which in-flight requests
are held against, where it holds one; else the database's).

Once: a Notification row per (tenant, kind, subject, period). The unique constraint makes it one
however many workers look at the same moment, and only the one whose insert won delivers it.

Periods: a budget alert's is the budget period's label (20260501, 2026W18, 202605). A balance
alert's is the episode below the threshold, `c<id>` of the last credit that left the balance at
or above it (`c0`: none ever did): it alerts again only once a credit lifted the balance back to
the threshold and it fell below again. Charges never open an episode, so the database's
movements lagging Redis's copy by a flush cannot make one dip two alerts. The subject carries
the threshold, so an owner who raises it past the balance hears at once.

Delivery is at least once: a worker that dies between sending and recording sends again, with
the same event id, which receivers deduplicate on.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import ipaddress
import logging
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import orjson
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from apps.billing.choices import PERIOD_ADJECTIVES, BillingMode
from apps.billing.counters import balance_key, period_bounds
from apps.billing.models import BalanceMovement, BillingAccount, Budget, Notification
from apps.billing.money import as_text, from_micros
from apps.billing.selectors import BudgetStatus, account_find, budget_status
from dmxplatform.redis_client import request_mget, request_redis

logger = logging.getLogger(__name__)


class AlertKind(StrEnum):
    """A notification's kind, and its webhook event's type."""

    BUDGET_WARNING = "budget.warning"  # past DMX_BUDGET_ALERT_PERCENT
    BUDGET_REACHED = "budget.reached"  # past 100%
    BALANCE_LOW = "balance.low"


# apps.keys.choices.MemberRole.OWNER: billing sits below keys and names its models by label only.
OWNER_ROLE = "owner"
# A receiver has this long to answer, seconds: an endpoint should acknowledge and work later.
WEBHOOK_TIMEOUT_SECONDS = 10
# A notification no delivery has tried this long after it was made lost its task (the broker
# was away when it was queued, or the worker died with it): it is queued again.
STRANDED_AFTER = timedelta(minutes=5)
# A credit this long before a balance alert was recorded is read again for the next episode:
# one that landed between the alert's reading and its insert, or on a worker whose clock is
# behind, still opens the next episode.
EPISODE_MARGIN = timedelta(minutes=1)
SIGNATURE_HEADER = "X-DMX-Signature"


def _event(
    kind: AlertKind, *, tenant: Any, period: str, now: datetime, data: dict[str, Any]
) -> dict[str, Any]:
    """A webhook event's body (stored as the notification's payload, so retries resend it)."""
    return {
        "id": f"evt_{uuid.uuid4().hex}",
        "type": str(kind),
        "created_at": now.isoformat(),
        "tenant": {"id": tenant.id, "slug": tenant.slug, "name": tenant.name},
        "currency": settings.DMX_CURRENCY,
        "period": period,
        **data,
    }


def _record(
    kind: AlertKind,
    *,
    tenant_id: int,
    subject: str,
    period: str,
    payload: Callable[[], dict[str, Any]],
) -> int | None:
    """The new notification's id, or None where one was made before (by this or another
    worker). `payload` is called only when the row is made."""
    notification, created = Notification.objects.get_or_create(
        tenant_id=tenant_id,
        kind=kind,
        subject=subject,
        period=period,
        defaults={"payload": payload},
    )
    return notification.id if created else None


def _levels(status: BudgetStatus) -> list[tuple[AlertKind, int]]:
    """The alert levels, in percent, the budget's spend is at or past."""
    amount = status.budget.amount
    if amount <= 0:
        return []  # a zero budget is a block, not a limit to watch
    warn = settings.DMX_BUDGET_ALERT_PERCENT
    levels = []
    if warn < 100 and status.spent * 100 >= amount * warn:
        levels.append((AlertKind.BUDGET_WARNING, warn))
    if status.spent >= amount or status.refused:
        levels.append((AlertKind.BUDGET_REACHED, 100))
    return levels


def _budget_data(status: BudgetStatus, percent: int) -> dict[str, Any]:
    budget = status.budget
    return {
        "budget": {
            "id": budget.id,
            "scope": "key" if budget.api_key_id else "tenant",
            "api_key": budget.api_key.key_id if budget.api_key_id else None,
            "period": budget.period,
            "amount": as_text(budget.amount),
            "hard": budget.hard,
            "spent": as_text(status.spent),
            "threshold_percent": percent,
            "period_start": status.starts_at.isoformat(),
            "resets_at": status.resets_at.isoformat(),
        }
    }


def _budget_alerts(now: datetime) -> list[int]:
    created = []
    tenant_ids = Budget.objects.order_by().values_list("tenant_id", flat=True).distinct()
    for tenant_id in tenant_ids:
        for status in budget_status(tenant_id, now=now):
            label = period_bounds(status.budget.period, now)[0]
            for kind, percent in _levels(status):

                def payload(status=status, kind=kind, percent=percent, label=label):
                    return _event(
                        kind,
                        tenant=status.budget.tenant,
                        period=label,
                        now=now,
                        data=_budget_data(status, percent),
                    )

                new = _record(
                    kind,
                    tenant_id=tenant_id,
                    subject=f"budget:{status.budget.id}",
                    period=label,
                    payload=payload,
                )
                if new is not None:
                    created.append(new)
    return created


def _held(account: BillingAccount, raw: bytes | None) -> Decimal:
    return account.balance if raw is None else from_micros(int(raw))


def _balance_now(account: BillingAccount) -> Decimal:
    raw = request_redis().get(balance_key(account.tenant_id))
    if raw is not None:
        return from_micros(int(raw))
    return BillingAccount.objects.values_list("balance", flat=True).get(pk=account.pk)


def _episode(account: BillingAccount, subject: str) -> str:
    """The balance's episode below the account's threshold (the module's docstring)."""
    credits = BalanceMovement.objects.filter(
        account=account, amount__gt=0, balance_after__gte=account.low_balance_threshold
    )
    last = (
        Notification.objects.filter(
            tenant_id=account.tenant_id, kind=AlertKind.BALANCE_LOW, subject=subject
        )
        .order_by("-created_at", "-id")
        .first()
    )
    if last is not None:
        # Read only the movements since the last alert (an account's are indexed by time): the
        # charges that took the balance down to it may be many, and this runs every time.
        credits = credits.filter(created_at__gte=last.created_at - EPISODE_MARGIN)
    found = credits.order_by("-created_at", "-id").values_list("id", flat=True).first()
    if found is None and last is not None:
        return last.period
    return f"c{found or 0}"


def _balance_alerts(now: datetime) -> list[int]:
    accounts = list(
        BillingAccount.objects.filter(
            mode=BillingMode.PREPAID, low_balance_threshold__isnull=False
        ).select_related("tenant")
    )
    if not accounts:
        return []
    held = request_mget([balance_key(account.tenant_id) for account in accounts])
    created = []
    for account, raw in zip(accounts, held, strict=True):
        threshold = account.low_balance_threshold
        if _held(account, raw) >= threshold:
            continue
        subject = f"balance:{as_text(threshold)}"
        episode = _episode(account, subject)
        # Read again after the episode: a credit in between that lifted the balance opened a
        # new episode, which the first reading does not belong to.
        balance = _balance_now(account)
        if balance >= threshold:
            continue

        def payload(account=account, episode=episode, balance=balance):
            data = {
                "balance": {
                    "amount": as_text(balance),
                    "threshold": as_text(account.low_balance_threshold),
                }
            }
            return _event(
                AlertKind.BALANCE_LOW, tenant=account.tenant, period=episode, now=now, data=data
            )

        new = _record(
            AlertKind.BALANCE_LOW,
            tenant_id=account.tenant_id,
            subject=subject,
            period=episode,
            payload=payload,
        )
        if new is not None:
            created.append(new)
    return created


def notifications_raise(*, now: datetime | None = None) -> list[int]:
    """Record an alert for every budget and balance past a threshold that has none for this
    period yet; returns the new notifications' ids, for delivery."""
    moment = now or timezone.now()
    return _budget_alerts(moment) + _balance_alerts(moment)


def notifications_stranded(*, now: datetime | None = None) -> list[int]:
    """Notifications whose delivery was never tried, STRANDED_AFTER after they were made."""
    moment = now or timezone.now()
    return list(
        Notification.objects.filter(attempts=0, created_at__lt=moment - STRANDED_AFTER)
        .order_by("id")
        .values_list("id", flat=True)
    )


def webhook_secret_ensure(*, account: BillingAccount) -> str:
    """The account's webhook signing secret, made the first time it is needed (two workers
    making one at once keep the first stored)."""
    if not account.webhook_secret:
        BillingAccount.objects.filter(pk=account.pk, webhook_secret="").update(
            webhook_secret=f"whsec_{secrets.token_urlsafe(32)}"
        )
        account.refresh_from_db(fields=["webhook_secret"])
    return account.webhook_secret


def webhook_signature(*, secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256, hex, of `<timestamp>.<body>` under the secret (Stripe's scheme)."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


class WebhookError(Exception):
    """The receiver did not take the event: no answer, or not a 2xx."""


def _public_address(host: str, port: int) -> str | None:
    """The address to connect to: `host` resolved once, refused unless every address it has is
    public (unless DMX_WEBHOOK_ALLOW_PRIVATE: then None, resolved as usual). A tenant's URL must
    not reach the platform's own network, and the connection goes to the address checked, so a
    name whose DNS answer changes in between (rebinding) cannot swap a private one in."""
    if settings.DMX_WEBHOOK_ALLOW_PRIVATE:
        return None
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise WebhookError(f"{host} does not resolve: {exc}") from exc
    for *_, address in found:
        ip = ipaddress.ip_address(address[0])
        if not ip.is_global:
            raise WebhookError(f"{host} is at {ip}, not a public address")
    return found[0][4][0]


def _connect_to(address: str, target: tuple[str, int], *args: Any, **kwargs: Any):
    return socket.create_connection((address, target[1]), *args, **kwargs)


def _webhook_post(url: str, *, secret: str, payload: dict[str, Any]) -> None:
    """POST the event, signed; a redirect is no delivery (the event goes only where the tenant
    said), nor any answer but a 2xx."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # a port past 65535, or not a number: Django's URL check lets it by
        raise WebhookError(f"bad port in {url}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookError(f"not an http(s) URL: {url}")
    pinned = _public_address(parts.hostname, port)
    body = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    timestamp = int(time.time())
    signature = webhook_signature(secret=secret, timestamp=timestamp, body=body)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "DMX-Webhooks/1",
        "X-DMX-Event": payload["type"],
        "X-DMX-Event-Id": payload["id"],
        SIGNATURE_HEADER: f"t={timestamp},v1={signature}",
    }
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        connection = kind(parts.hostname, port, timeout=WEBHOOK_TIMEOUT_SECONDS)
        if pinned is not None:
            # The Host header and TLS's server name stay the URL's; only the socket is pinned.
            connection._create_connection = functools.partial(_connect_to, pinned)  # type: ignore[attr-defined]
        try:
            connection.request(
                "POST",
                f"{parts.path or '/'}{'?' if parts.query else ''}{parts.query}",
                body,
                headers,
            )
            status = connection.getresponse().status
        finally:
            connection.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a bad port
        raise WebhookError(str(exc) or type(exc).__name__) from exc
    if not 200 <= status < 300:
        raise WebhookError(f"answered {status}")


def _recipients(tenant_id: int, account: BillingAccount | None) -> list[str]:
    """The account's alert address, or else its tenant's owners'."""
    if account is not None and account.notify_email:
        return [account.notify_email]
    owners = get_user_model().objects.filter(
        memberships__tenant_id=tenant_id, memberships__role=OWNER_ROLE, is_active=True
    )
    return sorted(set(owners.exclude(email="").values_list("email", flat=True)))


def _mail(payload: dict[str, Any]) -> tuple[str, str]:
    """The alert's subject and text."""
    tenant, currency = payload["tenant"]["name"], payload["currency"]
    if payload["type"] == AlertKind.BALANCE_LOW:
        balance = payload["balance"]
        return (
            f"{tenant}: prepaid balance below {balance['threshold']} {currency}",
            f"The prepaid balance of {tenant} on DMX is {balance['amount']} {currency}, below "
            f"the {balance['threshold']} {currency} you set. Requests are refused once it "
            f"cannot cover them: top it up or redeem a code in the portal.\n",
        )
    budget = payload["budget"]
    owner = f"key {budget['api_key']}" if budget["api_key"] else tenant
    reached = payload["type"] == AlertKind.BUDGET_REACHED
    consequence = (
        ("Requests that could pass it are refused" if budget["hard"] else "Requests go on")
        + f" until it resets at {budget['resets_at']}."
        if reached
        else f"It resets at {budget['resets_at']}."
    )
    every = PERIOD_ADJECTIVES.get(budget["period"], budget["period"])
    return (
        f"{tenant}: {budget['threshold_percent']}% of the {every} budget of {owner} spent",
        f"{owner} on DMX has spent {budget['spent']} {currency} of its {every} budget of "
        f"{budget['amount']} {currency} (period {payload['period']}). {consequence}\n",
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one delivery run did: everything sent, or seconds until the next try (None:
    nothing more to try: delivered, given up, or another worker is delivering it)."""

    delivered: bool
    retry_in: int | None = None


def notification_deliver(*, notification_id: int) -> Delivery:
    """Mail the alert and post it to the tenant's webhook, each once; a failure of either is
    tried again after DMX_WEBHOOK_BACKOFF_SECONDS, doubling, DMX_WEBHOOK_ATTEMPTS runs in all."""
    with transaction.atomic():
        # The row's lock is the delivery's: a second run (a retry, a stranded one queued again)
        # skips it rather than sending twice.
        notification = (
            Notification.objects.select_for_update(skip_locked=True)
            .filter(pk=notification_id)
            .first()
        )
        if notification is None:
            return Delivery(delivered=False)
        account = account_find(notification.tenant_id)
        url = account.webhook_url if account is not None else ""
        if notification.email_sent_at and (notification.webhook_sent_at or not url):
            return Delivery(delivered=True)
        failed = False
        if notification.email_sent_at is None:
            recipients = _recipients(notification.tenant_id, account)
            if recipients:
                subject, message = _mail(notification.payload)
                try:
                    send_mail(subject, message, from_email=None, recipient_list=recipients)
                    notification.email_sent_at = timezone.now()
                except OSError as exc:  # smtplib's errors are OSErrors
                    failed = True
                    logger.warning("notification %s: mail not sent: %s", notification.id, exc)
        if url and notification.webhook_sent_at is None:
            try:
                _webhook_post(
                    url, secret=webhook_secret_ensure(account=account), payload=notification.payload
                )
                notification.webhook_sent_at = timezone.now()
            except WebhookError as exc:
                failed = True
                logger.warning("notification %s: webhook not taken: %s", notification.id, exc)
        notification.attempts += 1
        notification.save(update_fields=["email_sent_at", "webhook_sent_at", "attempts"])
    if not failed:
        return Delivery(delivered=True)
    if notification.attempts >= settings.DMX_WEBHOOK_ATTEMPTS:
        logger.error(
            "notification %s (%s of tenant %s) not delivered after %s attempts",
            notification.id,
            notification.kind,
            notification.tenant_id,
            notification.attempts,
        )
        return Delivery(delivered=False)
    backoff = settings.DMX_WEBHOOK_BACKOFF_SECONDS * 2 ** (notification.attempts - 1)
    return Delivery(delivered=False, retry_in=backoff)
