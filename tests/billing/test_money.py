"""Cost arithmetic in micro-units: exact, rounded half to even once, reservations rounded up."""

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.billing.money import Rates, from_micros, to_micros

# $0.15 / $0.075 / $0.60 per million tokens.
RATES = Rates(input=150_000, cached_input=75_000, output=600_000)
FULL = 10_000  # a multiplier of 1.0000


def test_a_cost_is_the_tokens_at_their_prices():
    # 1,000 prompt tokens (400 cached) and 500 completion tokens:
    # 600 * 0.15 + 400 * 0.075 + 500 * 0.60 per million = 0.000420 exactly.
    assert RATES.cost(1_000, 400, 500, FULL) == 420
    assert RATES.cost(1_000, 0, 500, FULL) == 450
    # A plan at 0.8 pays 80%.
    assert RATES.cost(1_000, 400, 500, 8_000) == 336


def test_fractions_of_a_micro_unit_round_half_to_even_once():
    one = Rates(input=1, cached_input=1, output=1)  # 0.000001 per million tokens
    assert one.cost(500_000, 0, 0, FULL) == 0  # 0.5 micro-units: to the even 0
    assert one.cost(1_500_000, 0, 0, FULL) == 2  # 1.5: to the even 2
    assert one.cost(2_500_000, 0, 0, FULL) == 2  # 2.5: to the even 2
    assert one.cost(2_500_001, 0, 0, FULL) == 3


def test_cached_tokens_never_count_beyond_the_prompt():
    assert RATES.cost(100, 500, 0, FULL) == RATES.cost(100, 100, 0, FULL)


@given(
    prompt=st.integers(0, 2_000_000),
    cached=st.integers(0, 2_000_000),
    completion=st.integers(0, 2_000_000),
    multiplier=st.integers(0, 30_000),
)
def test_the_reservation_is_never_less_than_any_cost_it_covers(
    prompt, cached, completion, multiplier
):
    worst = RATES.worst_case(prompt, completion, multiplier)
    assert RATES.cost(prompt, cached, completion, multiplier) <= worst
    exact = Decimal(prompt * RATES.input + completion * RATES.output) * multiplier / 10**10
    assert worst - 1 < exact <= worst


def test_the_reservation_prices_each_token_at_the_highest_version_price():
    cheap = Rates(input=100, cached_input=50, output=200)
    dear = Rates(input=300, cached_input=10, output=100)
    assert Rates.most([cheap, dear]) == Rates(input=300, cached_input=50, output=200)


def test_stored_amounts_and_micro_units_convert_exactly():
    assert to_micros(Decimal("12.345678")) == 12_345_678
    assert from_micros(12_345_678) == Decimal("12.345678")
    with pytest.raises(ValueError):
        to_micros(Decimal("0.0000001"))


def test_a_batch_request_pays_its_share_of_the_price_in_the_same_single_rounding():
    half = Rates(input=150_000, cached_input=75_000, output=600_000, batch_percent=50)
    assert half.cost(1_000, 400, 500, FULL, batch=True) == 210  # 420 at full price
    assert half.cost(1_000, 400, 500, FULL) == 420  # interactive: the full price
    assert half.cost(1_000, 400, 500, 8_000, batch=True) == 168  # a plan at 0.8 too
    one = Rates(input=1, cached_input=1, output=1, batch_percent=50)
    # 1.5 micro-units at full price; 0.75 at half, rounded once to 1 (not 2 halved to 1.0
    # and not 1.5 rounded to 2 then halved).
    assert one.cost(1_500_000, 0, 0, FULL, batch=True) == 1
    assert one.cost(1_000_000, 0, 0, FULL, batch=True) == 0  # 0.5: to the even 0


@given(
    prompt=st.integers(0, 2_000_000),
    cached=st.integers(0, 2_000_000),
    completion=st.integers(0, 2_000_000),
    percent=st.integers(0, 100),
)
def test_a_batch_reservation_covers_its_batch_cost(prompt, cached, completion, percent):
    rates = Rates(input=150_000, cached_input=75_000, output=600_000, batch_percent=percent)
    worst = rates.worst_case(prompt, completion, FULL, batch=True)
    assert rates.cost(prompt, cached, completion, FULL, batch=True) <= worst
    assert worst <= rates.worst_case(prompt, completion, FULL)


def test_a_reservation_over_versions_takes_the_highest_batch_share():
    assert Rates.most([Rates(1, 1, 1, 50), Rates(1, 1, 1, 70)]).batch_percent == 70
