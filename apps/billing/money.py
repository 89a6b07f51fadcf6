"""Amounts of money as the hot path handles them: integers of micro-units (a millionth of the
platform's currency, DMX_CURRENCY), never floats.

PostgreSQL stores amounts as Decimal with six places, so a stored amount and its micro-units
convert exactly both ways. Redis holds budgets' spend and prepaid balances as integers too (Lua
numbers are doubles, INCRBY is int64): a counter there always equals the sum of what was added
to it. A request's cost is computed once, in integers, from token counts and the prices per
million tokens, and rounded half to even once; a
reservation is rounded up, so it is never less than the cost it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

MICROS = 1_000_000
# Prices are per million tokens; a plan's multiplier has four decimal places.
TOKENS_PER_PRICE = 1_000_000
MULTIPLIER_SCALE = 10_000
# What a scaled cost (Rates._scaled: prices per million, multiplier, percentage) divides by.
_DIVISOR = TOKENS_PER_PRICE * MULTIPLIER_SCALE * 100
_QUANTUM = Decimal("0.000001")
# The most any amount (a budget, a credit, a code's face value, a balance) may be: its
# micro-units stay below 2**53, which Lua's numbers (doubles) hold exactly, and far below the
# int64 of Redis's counters. Inputs take this many digits (six of them after the point).
MAX_AMOUNT = Decimal("1000000000")
AMOUNT_INPUT_DIGITS = 16


def to_micros(amount: Decimal) -> int:
    """Micro-units of a stored amount (six decimal places at most: anything finer refuses)."""
    scaled = amount * MICROS
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{amount} has more than six decimal places")
    return int(scaled)


def from_micros(micros: int) -> Decimal:
    return (Decimal(micros) / MICROS).quantize(_QUANTUM)


def as_text(amount: Decimal) -> str:
    """An amount as the API, webhooks and mails write it: six places, no exponent."""
    return format(amount.quantize(_QUANTUM), "f")


def multiplier_units(multiplier: Decimal) -> int:
    """A plan's price multiplier in ten-thousandths (Decimal(6, 4))."""
    return int(multiplier * MULTIPLIER_SCALE)


@dataclass(frozen=True, slots=True)
class Rates:
    """One model version's prices, micro-units per million tokens, with a plan's multiplier
    not yet applied. `cached_input` prices prompt tokens the engine served from its cache."""

    input: int
    cached_input: int
    output: int
    # The percentage of these prices a batch request pays (Price.batch_discount_percent off).
    batch_percent: int = 100

    @property
    def free(self) -> bool:
        return not (self.input or self.cached_input or self.output)

    def _scaled(
        self, prompt: int, cached: int, completion: int, multiplier: int, batch: bool
    ) -> int:
        """The cost times TOKENS_PER_PRICE * MULTIPLIER_SCALE * 100: an exact integer."""
        cached = min(cached, prompt)
        return (
            ((prompt - cached) * self.input + cached * self.cached_input + completion * self.output)
            * multiplier
            * (self.batch_percent if batch else 100)
        )

    def cost(
        self, prompt: int, cached: int, completion: int, multiplier: int, *, batch: bool = False
    ) -> int:
        """What the tokens cost, micro-units, rounded half to even once (a batch's discount
        inside the same rounding)."""
        whole, rest = divmod(self._scaled(prompt, cached, completion, multiplier, batch), _DIVISOR)
        twice = 2 * rest
        if twice > _DIVISOR or (twice == _DIVISOR and whole % 2):
            whole += 1
        return whole

    def worst_case(
        self, prompt: int, completion: int, multiplier: int, *, batch: bool = False
    ) -> int:
        """The most a request of `prompt` tokens generating up to `completion` may cost (no
        cached tokens), rounded up."""
        return -(-self._scaled(prompt, 0, completion, multiplier, batch) // _DIVISOR)

    @staticmethod
    def most(rates: list[Rates]) -> Rates:
        """Each price at its highest among several versions (a reservation before routing
        knows which version serves)."""
        return Rates(
            input=max(r.input for r in rates),
            cached_input=max(r.cached_input for r in rates),
            output=max(r.output for r in rates),
            batch_percent=max(r.batch_percent for r in rates),
        )
