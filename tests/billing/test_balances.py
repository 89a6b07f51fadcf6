"""Prepaid balances: each movement once, the balance always the sum of its movements and never
below zero; a redemption code credits one tenant once, however many redeem it at once."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.billing.choices import MovementKind
from apps.billing.counters import balance_key
from apps.billing.models import BalanceMovement, BillingAccount, RedemptionCode
from apps.billing.services import (
    Charge,
    RedemptionError,
    account_of,
    balance_seed,
    codes_generate,
    credit,
    ledger_check,
    redeem,
    top_up,
    usage_charges,
)
from dmxplatform.redis_client import request_redis
from tests.keys.factories import make_tenant

pytestmark = pytest.mark.usefixtures("private_redis")


def movements_sum(tenant_id: int) -> Decimal:
    return sum(
        (m.amount for m in BalanceMovement.objects.filter(account__tenant_id=tenant_id)),
        Decimal(0),
    )


def held(tenant_id: int) -> int | None:
    raw = request_redis().get(balance_key(tenant_id))
    return None if raw is None else int(raw)


@pytest.mark.django_db
def test_a_top_up_with_the_same_key_counts_once_and_reaches_the_balance_redis_holds():
    tenant = make_tenant()
    assert balance_seed(tenant.id) == 0  # Redis now holds this balance
    for _ in range(2):
        top_up(tenant_id=tenant.id, amount=Decimal("5.25"), actor="ops", key="invoice-17")
    top_up(tenant_id=tenant.id, amount=Decimal("0.000001"), actor="ops")
    account = account_of(tenant.id)
    assert account.balance == Decimal("5.250001") == movements_sum(tenant.id)
    assert held(tenant.id) == 5_250_001
    assert account.movements.count() == 2


@pytest.mark.django_db
def test_a_credit_before_redis_holds_the_balance_is_in_the_seed():
    tenant = make_tenant()
    top_up(tenant_id=tenant.id, amount=Decimal("1"), actor="ops")
    assert held(tenant.id) is None  # not credited twice: the seed reads it from the book
    assert balance_seed(tenant.id) == 1_000_000
    assert balance_seed(tenant.id) == 1_000_000  # a second seed changes nothing


@pytest.mark.django_db
def test_usage_charges_are_recorded_once_and_never_take_the_balance_below_zero():
    tenant = make_tenant()
    top_up(tenant_id=tenant.id, amount=Decimal("0.001"), actor="ops")
    charges = [Charge(tenant.id, "req_a", 400), Charge(tenant.id, "req_b", 0)]
    assert usage_charges(charges) == 1
    assert usage_charges(charges) == 0  # a redelivered record is not charged again
    assert usage_charges([Charge(tenant.id, "req_c", 900)]) == 1  # 0.0009 of 0.0006 left
    account = account_of(tenant.id)
    assert account.balance == 0 == movements_sum(tenant.id) - 0
    assert ledger_check() == []


@pytest.mark.django_db
def test_the_ledger_check_finds_a_balance_that_is_not_the_sum_of_its_movements():
    tenant = make_tenant()
    top_up(tenant_id=tenant.id, amount=Decimal("2"), actor="ops")
    BillingAccount.objects.filter(tenant=tenant).update(balance=Decimal("3"))
    assert ledger_check() == [(tenant.id, Decimal("3"), Decimal("2"))]


@pytest.mark.django_db
def test_codes_are_stored_hashed_and_say_why_they_do_not_redeem():
    batch, codes = codes_generate(face_value=Decimal("10"), count=3, actor="ops")
    assert len(set(codes)) == 3
    stored = set(RedemptionCode.objects.filter(batch=batch).values_list("code_hash", flat=True))
    assert not any(code in hashes for code in codes for hashes in stored)
    tenant = make_tenant()
    movement = redeem(tenant_id=tenant.id, code=codes[0].lower())  # any case, dashes or not
    assert (movement.kind, movement.amount) == (MovementKind.REDEMPTION, Decimal("10"))
    with pytest.raises(RedemptionError) as used:
        redeem(tenant_id=make_tenant().id, code=codes[0])
    assert used.value.code == "redemption_code_used"
    with pytest.raises(RedemptionError) as invalid:
        redeem(tenant_id=tenant.id, code="DMX-NOPE-NOPE-NOPE-NOPE-NOPE")
    assert invalid.value.code == "redemption_code_invalid"
    _, expired = codes_generate(
        face_value=Decimal("1"), count=1, expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(RedemptionError) as late:
        redeem(tenant_id=tenant.id, code=expired[0])
    assert late.value.code == "redemption_code_expired"
    assert account_of(tenant.id).balance == Decimal("10")


@pytest.mark.django_db(transaction=True)
def test_fifty_tenants_redeeming_one_code_at_once_credit_exactly_one():
    _, (code,) = codes_generate(face_value=Decimal("25"), count=1)
    tenants = [make_tenant() for _ in range(50)]
    start = threading.Barrier(len(tenants))
    outcomes: list[str] = []

    def attempt(tenant_id: int) -> None:
        try:
            start.wait()
            redeem(tenant_id=tenant_id, code=code)
            outcomes.append("credited")
        except RedemptionError as exc:
            outcomes.append(str(exc.code))
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(t.id,)) for t in tenants]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(set(outcomes)) == ["credited", "redemption_code_used"]
    assert outcomes.count("credited") == 1
    credits = BalanceMovement.objects.filter(kind=MovementKind.REDEMPTION)
    assert credits.count() == 1 and credits.get().amount == Decimal("25")
    assert sum(BillingAccount.objects.values_list("balance", flat=True), Decimal(0)) == 25


OPERATION = st.one_of(
    st.tuples(st.just("top_up"), st.integers(1, 5_000_000)),
    st.tuples(st.just("redeem"), st.integers(1, 5_000_000)),
    st.tuples(st.just("charge"), st.integers(0, 8_000_000)),
    st.tuples(st.just("refund"), st.integers(1, 1_000_000)),
    st.tuples(st.just("replay"), st.integers(0, 50)),
)


@pytest.mark.django_db
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=st.lists(OPERATION, max_size=25))
def test_any_interleaving_keeps_the_balance_the_sum_of_its_movements_and_never_negative(
    operations,
):
    tenant = make_tenant()
    keys: list[str] = []
    for number, (kind, micros) in enumerate(operations):
        amount = Decimal(micros) / 1_000_000
        if kind == "top_up":
            keys.append(top_up(tenant_id=tenant.id, amount=amount, actor="p").idempotency_key)
        elif kind == "redeem":
            _, (code,) = codes_generate(face_value=amount, count=1)
            keys.append(redeem(tenant_id=tenant.id, code=code).idempotency_key)
        elif kind == "charge":
            usage_charges([Charge(tenant.id, f"req_{tenant.id}_{number}", micros)])
        elif kind == "refund":
            keys.append(
                credit(
                    tenant_id=tenant.id,
                    kind=MovementKind.REFUND,
                    amount=amount,
                    key=f"refund:{tenant.id}:{number}",
                ).idempotency_key
            )
        elif keys:  # a retried credit: nothing moves
            before = account_of(tenant.id).balance
            movement = BalanceMovement.objects.get(idempotency_key=keys[micros % len(keys)])
            credit(
                tenant_id=tenant.id,
                kind=movement.kind,
                amount=movement.amount,
                key=movement.idempotency_key,
            )
            assert account_of(tenant.id).balance == before
        balance = account_of(tenant.id).balance
        assert balance >= 0
        assert balance == movements_sum(tenant.id)


@pytest.mark.django_db
def test_a_credit_whose_commit_failed_reaches_redis_once_when_it_is_retried():
    from django.db import transaction

    tenant = make_tenant()
    balance_seed(tenant.id)
    with pytest.raises(RuntimeError), transaction.atomic():
        top_up(tenant_id=tenant.id, amount=Decimal("2"), actor="ops", key="retried")
        raise RuntimeError("the commit never happens")
    assert account_of(tenant.id).balance == 0 and held(tenant.id) == 2_000_000
    top_up(tenant_id=tenant.id, amount=Decimal("2"), actor="ops", key="retried")
    assert account_of(tenant.id).balance == Decimal("2") and held(tenant.id) == 2_000_000


@pytest.mark.django_db
def test_amounts_past_the_limit_are_refused():
    from django.core.exceptions import ValidationError

    from apps.billing.money import MAX_AMOUNT
    from apps.billing.services import budget_set

    tenant = make_tenant()
    with pytest.raises(ValidationError):
        budget_set(tenant_id=tenant.id, period="month", amount=MAX_AMOUNT + 1)
    top_up(tenant_id=tenant.id, amount=MAX_AMOUNT, actor="ops")
    with pytest.raises(ValidationError):
        top_up(tenant_id=tenant.id, amount=Decimal("0.000001"), actor="ops")
    with pytest.raises(ValueError):
        codes_generate(face_value=MAX_AMOUNT + 1, count=1)
