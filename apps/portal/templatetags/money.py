"""Amounts of money as the portal shows them: exact decimals in the platform's currency.

Stored amounts have six decimal places; a page shows as many of them as the amount needs, two
at least (1.50, 0.000125), with thousands grouped, never through a float.
"""

from __future__ import annotations

from decimal import Decimal

from django import template
from django.conf import settings

register = template.Library()

# Cents at least, so that 12.5 reads as money; six at most, the stored precision.
MIN_PLACES = 2
MAX_PLACES = 6
FIGURE_SPACE = "\u2007"  # as wide as a digit


def _decimal(value) -> Decimal | None:
    if value is None or value == "":
        return None
    if isinstance(value, float):
        # A float here is a bug upstream: it has already lost the amount's exactness.
        raise TypeError(f"an amount of money must be a Decimal, not the float {value!r}")
    return value if isinstance(value, Decimal) else Decimal(value)


def _places(amount: Decimal) -> int:
    return min(max(MIN_PLACES, -int(amount.normalize().as_tuple().exponent)), MAX_PLACES)


def amount_text(value) -> str:
    """`value` with 2 to 6 decimal places and grouped thousands; empty for no amount."""
    amount = _decimal(value)
    return "" if amount is None else f"{amount:,.{_places(amount)}f}"


def aligned_text(value) -> str:
    """amount_text padded with figure spaces to six places, so that a right-aligned column of
    amounts lines up on the decimal point (with tabular figures)."""
    amount = _decimal(value)
    if amount is None:
        return ""
    return amount_text(amount) + FIGURE_SPACE * (MAX_PLACES - _places(amount))


def money_text(value) -> str:
    """`value` with the currency: "1,234.50 USD"; empty for no amount."""
    text = amount_text(value)
    return f"{text} {settings.DMX_CURRENCY}" if text else ""


@register.filter
def amount(value) -> str:
    return amount_text(value)


@register.filter
def aligned(value) -> str:
    return aligned_text(value)


@register.filter
def money(value) -> str:
    return money_text(value)


@register.filter
def plain(value) -> str:
    """A decimal without trailing zeros or exponent (a price multiplier: 0.8000 reads 0.8)."""
    number = _decimal(value)
    return "" if number is None else f"{number.normalize():f}"


@register.simple_tag
def currency() -> str:
    return settings.DMX_CURRENCY


@register.filter
def percent(ratio) -> int:
    """A share (0.42) as a whole percentage, rounded down (1.3: 130)."""
    if ratio is None:
        return 0
    return max(0, int(Decimal(str(ratio)) * 100))


@register.filter
def bar_width(ratio) -> int:
    """A share as the width of a bar, in percent of the bar: 0 to 100."""
    return min(100, percent(ratio))
