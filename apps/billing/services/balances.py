"""Prepaid balances: every change is a movement, made once (its idempotency key), the balance
moving with it in the same transaction under the account's row lock, never below zero (the
database refuses it too).

Redis holds each prepaid balance the gateways check and hold against (apps.billing.counters), in
micro-units. A credit (top-up, redemption, refund) reaches it inside the transaction that
records it, under the same lock that seeding takes, so a credit is counted there exactly once
whichever comes first; a usage charge was already taken there at admission and settle, and
only its movement is written here, when the flush stores the request's record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Sum

from apps.billing import metrics
from apps.billing.choices import MovementKind
from apps.billing.counters import balance_key, credited_key
from apps.billing.models import BalanceMovement, BillingAccount
from apps.billing.money import MAX_AMOUNT, from_micros, to_micros
from apps.billing.signals import tenant_billing_changed
from dmxplatform.redis_client import request_redis

logger = logging.getLogger(__name__)

# Credit a balance Redis holds, once per movement (KEYS[2] marks it, for as long as a retry of
# the call could come: a reply lost to a timeout, a commit that failed after it); one Redis does
# not hold yet is seeded from the database when a request first needs it (balance_seed), with
# this credit in it.
_CREDIT = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[2]) then
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return false
"""
CREDIT_MARK_SECONDS = 7 * 24 * 3600


def account_of(tenant_id: int, *, lock: bool = False) -> BillingAccount:
    """The tenant's account, made (postpaid, empty) the first time it is asked for."""
    account, _ = BillingAccount.objects.get_or_create(tenant_id=tenant_id)
    if lock:
        return BillingAccount.objects.select_for_update().get(pk=account.pk)
    return account


def account_update(*, account: BillingAccount, **values) -> BillingAccount:
    """Change an account's mode, alert threshold or alert targets; the gateways' key records
    (which carry the mode) are republished."""
    for name, value in values.items():
        setattr(account, name, value)
    account.full_clean()
    # Only what changed: the balance and version are the movements' to write, and a charge
    # landing meanwhile must not be overwritten by what this copy read.
    account.save(update_fields=[*values, "updated_at"])
    _changed(account.tenant_id)
    return account


def _changed(tenant_id: int) -> None:
    transaction.on_commit(
        lambda: tenant_billing_changed.send(sender=BillingAccount, tenant_id=tenant_id)
    )


def _move(
    account: BillingAccount,
    *,
    kind: str,
    amount: Decimal,
    key: str,
    note: str = "",
    actor: str = "",
) -> tuple[BalanceMovement, bool]:
    """Record one movement on a locked account; (the movement, whether it is new). A key seen
    before returns that movement and changes nothing."""
    existing = BalanceMovement.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return existing, False
    balance = account.balance + amount
    if balance < 0:
        raise ValidationError(
            f"The balance ({account.balance}) does not cover {-amount}.", code="balance_too_low"
        )
    if balance > MAX_AMOUNT:
        raise ValidationError(
            f"A balance holds at most {MAX_AMOUNT}: this would make it {balance}.",
            code="balance_too_high",
        )
    movement = BalanceMovement.objects.create(
        account=account,
        kind=kind,
        amount=amount,
        balance_after=balance,
        idempotency_key=key,
        note=note,
        actor=actor,
    )
    account.balance = balance
    account.version += 1
    BillingAccount.objects.filter(pk=account.pk).update(balance=balance, version=F("version") + 1)
    return movement, True


def credit(
    *,
    tenant_id: int,
    kind: str,
    amount: Decimal,
    key: str,
    note: str = "",
    actor: str = "",
) -> BalanceMovement:
    """Add money to a balance (a top-up, a redemption, a refund, a positive adjustment), in
    the database and in Redis's copy, once per `key`."""
    if amount <= 0:
        raise ValidationError("A credit must be more than zero.", code="invalid_amount")
    with transaction.atomic():
        account = account_of(tenant_id, lock=True)
        movement, new = _move(account, kind=kind, amount=amount, key=key, note=note, actor=actor)
        if new:
            # Inside the transaction and the lock: should Redis refuse, nothing was credited.
            request_redis().eval(
                _CREDIT,
                2,
                balance_key(tenant_id),
                credited_key(tenant_id, key),
                to_micros(amount),
                CREDIT_MARK_SECONDS,
            )
    if new:
        metrics.balance_movements.labels(kind).inc()
    return movement


def top_up(*, tenant_id: int, amount: Decimal, actor: str, key: str = "", note: str = ""):
    """An operator's top-up; `key` makes a retried call count once (the management API's
    Idempotency-Key), else every call is a new top-up."""
    return credit(
        tenant_id=tenant_id,
        kind=MovementKind.TOP_UP,
        amount=amount,
        key=f"topup:{tenant_id}:{key or uuid.uuid4().hex}",
        note=note,
        actor=actor,
    )


def balance_seed(tenant_id: int) -> int:
    """Give Redis a prepaid balance it does not hold (first use, or lost with Redis), from the
    database, under the lock credits take; returns the micro-units Redis holds now."""
    with transaction.atomic():
        account = account_of(tenant_id, lock=True)
        client = request_redis()
        client.set(balance_key(tenant_id), to_micros(account.balance), nx=True)
        return int(client.get(balance_key(tenant_id)) or 0)


@dataclass(frozen=True, slots=True)
class Charge:
    tenant_id: int
    request_id: str
    cost_micros: int


def usage_charges(charges: Iterable[Charge]) -> int:
    """Record prepaid requests' costs as charges (in the flush's transaction), once per
    request; returns how many were new. The money left Redis's copy at settle already.

    A charge larger than the balance here cannot happen while Redis's copy is the one the
    gateways checked; should it (that copy rebuilt from a stale balance), the balance is taken
    to zero, never below, and the difference is logged and counted."""
    by_tenant: dict[int, list[Charge]] = {}
    for charge in charges:
        if charge.cost_micros > 0:
            by_tenant.setdefault(charge.tenant_id, []).append(charge)
    keys = [f"usage:{c.request_id}" for group in by_tenant.values() for c in group]
    done = set(
        BalanceMovement.objects.filter(idempotency_key__in=keys).values_list(
            "idempotency_key", flat=True
        )
    )
    created = 0
    for tenant_id in sorted(by_tenant):  # one lock order for every flush
        account = account_of(tenant_id, lock=True)
        rows = []
        for charge in by_tenant[tenant_id]:
            key = f"usage:{charge.request_id}"
            if key in done:
                continue
            amount = from_micros(charge.cost_micros)
            if amount > account.balance:
                logger.error(
                    "request %s costs %s, the balance of tenant %s is %s: charged to zero",
                    charge.request_id,
                    amount,
                    tenant_id,
                    account.balance,
                )
                metrics.balance_shortfall.inc(float(amount - account.balance))
                amount = account.balance
            account.balance -= amount
            rows.append(
                BalanceMovement(
                    account=account,
                    kind=MovementKind.CHARGE,
                    amount=-amount,
                    balance_after=account.balance,
                    idempotency_key=key,
                )
            )
        if rows:
            BalanceMovement.objects.bulk_create(rows)
            BillingAccount.objects.filter(pk=account.pk).update(
                balance=account.balance, version=F("version") + len(rows)
            )
            created += len(rows)
    metrics.balance_movements.labels(MovementKind.CHARGE).inc(created)
    return created


def ledger_check() -> list[tuple[int, Decimal, Decimal]]:
    """Accounts whose balance is not the sum of their movements: (tenant, balance, sum). The
    gauge the alert watches is set to how many there are."""
    wrong = [
        (account.tenant_id, account.balance, account.total or Decimal(0))
        for account in BillingAccount.objects.annotate(total=Sum("movements__amount"))
        if account.balance != (account.total or Decimal(0))
    ]
    metrics.ledger_mismatches.set(len(wrong))
    for tenant_id, balance, total in wrong:
        logger.error("tenant %s: balance %s, movements add up to %s", tenant_id, balance, total)
    return wrong
