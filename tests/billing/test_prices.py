"""Prices: set ahead, never rewritten; the price book prices a moment as the rows say."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.billing.money import Rates
from apps.billing.pricing import PRICES_VERSION, price_book_load
from apps.billing.services import price_set, price_withdraw
from dmxplatform.redis_client import sync_redis
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def test_a_first_price_starts_now_and_a_new_one_only_after_the_lead_time(settings):
    settings.DMX_PRICE_LEAD_SECONDS = 60
    _, version = make_model("priced", prices=None)
    first = price_set(
        model_version_id=version.id,
        input_per_million=Decimal("1"),
        output_per_million=Decimal("2"),
    )
    assert first.cached_input_per_million == Decimal("1")  # defaults to the input price
    assert first.effective_from <= timezone.now()
    with pytest.raises(ValidationError) as too_soon:
        price_set(
            model_version_id=version.id,
            input_per_million=Decimal("3"),
            output_per_million=Decimal("4"),
            effective_from=timezone.now() + timedelta(seconds=30),
        )
    assert "effective_from" in too_soon.value.message_dict
    later = price_set(
        model_version_id=version.id, input_per_million=Decimal("3"), output_per_million=Decimal(4)
    )
    assert later.effective_from >= timezone.now() + timedelta(seconds=59)


def test_cached_input_may_not_cost_more_than_input():
    _, version = make_model("odd", prices=None)
    with pytest.raises(ValidationError):
        price_set(
            model_version_id=version.id,
            input_per_million=Decimal("1"),
            cached_input_per_million=Decimal("2"),
            output_per_million=Decimal("1"),
        )


@pytest.mark.django_db(transaction=True)
def test_a_price_change_bills_each_moment_at_its_own_price(settings):
    settings.DMX_PRICE_LEAD_SECONDS = 0
    _, version = make_model("changing", prices=("1.000000", "0.500000", "2.000000"))
    before = sync_redis().get(PRICES_VERSION.key)
    change_at = timezone.now() + timedelta(minutes=5)
    price_set(
        model_version_id=version.id,
        input_per_million=Decimal("3"),
        output_per_million=Decimal("4"),
        effective_from=change_at,
    )
    assert sync_redis().get(PRICES_VERSION.key) != before  # every gateway reloads
    book = price_book_load()
    old = book.rates(version.id, change_at.timestamp() - 1)
    new = book.rates(version.id, change_at.timestamp())
    # A batch pays half of each (batch_discount_percent's default).
    assert old == Rates(input=1_000_000, cached_input=500_000, output=2_000_000, batch_percent=50)
    assert new == Rates(input=3_000_000, cached_input=3_000_000, output=4_000_000, batch_percent=50)
    # The same 1,000 + 1,000 tokens: 0.003000 before, 0.007000 after.
    assert (old.cost(1000, 0, 1000, 10_000), new.cost(1000, 0, 1000, 10_000)) == (3_000, 7_000)
    assert book.rates(version.id, version.created_at.timestamp() - 3600) is None


def test_only_a_price_not_yet_in_force_can_be_withdrawn(settings):
    settings.DMX_PRICE_LEAD_SECONDS = 60
    _, version = make_model("withdrawn")
    in_force = version.prices.get()
    with pytest.raises(ValidationError):
        price_withdraw(price=in_force)
    future = price_set(
        model_version_id=version.id,
        input_per_million=Decimal("9"),
        output_per_million=Decimal("9"),
        effective_from=timezone.now() + timedelta(hours=1),
    )
    price_withdraw(price=future)
    assert list(version.prices.all()) == [in_force]


def test_the_reservation_needs_every_version_priced():
    _, v1 = make_model("two-versions")
    _, v2 = make_model("two-versions", version="v2", prices=None)
    book = price_book_load()
    now = timezone.now().timestamp()
    assert book.reservation_rates([v1.id], now) is not None
    assert book.reservation_rates([v1.id, v2.id], now) is None
