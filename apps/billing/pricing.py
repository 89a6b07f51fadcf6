"""Prices as every gateway holds them: each model version's price schedule, in micro-units,
reloaded when an operator adds a price (PRICES_VERSION, as the catalog reloads).

A price takes effect at least DMX_PRICE_LEAD_SECONDS after it is set, longer than any gateway
takes to reload, so every gateway prices a moment the same way; a request is priced at the
moment it arrived, whichever version serves it and however long it runs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from apps.billing.models import Price
from apps.billing.money import Rates, to_micros
from dmxplatform.versioned import VersionCounter

PRICES_VERSION = VersionCounter("prices")


@dataclass(frozen=True, slots=True)
class Schedule:
    """One model version's prices over time: `starts` ascending, `rates` beside them."""

    starts: tuple[float, ...]
    rates: tuple[Rates, ...]

    def at(self, moment: float) -> Rates | None:
        index = bisect.bisect_right(self.starts, moment) - 1
        return self.rates[index] if index >= 0 else None


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Every model version's schedule by version id; `version` is PRICES_VERSION's when built."""

    version: int = -1
    schedules: dict[int, Schedule] = field(default_factory=dict)

    def rates(self, version_id: int, moment: float) -> Rates | None:
        """The version's prices at `moment` (epoch seconds); None: it has none yet."""
        schedule = self.schedules.get(version_id)
        return schedule.at(moment) if schedule is not None else None

    def reservation_rates(self, version_ids: list[int], moment: float) -> Rates | None:
        """The prices to reserve at before routing picks a version: each at its highest among
        the versions that may serve; None when any of them has no price (it cannot be billed)."""
        found = [self.rates(version_id, moment) for version_id in version_ids]
        if not found or any(rates is None for rates in found):
            return None
        return Rates.most(found)  # type: ignore[arg-type]


def price_book_load(version: int = 0) -> PriceBook:
    rows: dict[int, tuple[list[float], list[Rates]]] = {}
    for price in Price.objects.order_by("model_version_id", "effective_from"):
        starts, rates = rows.setdefault(price.model_version_id, ([], []))
        starts.append(price.effective_from.timestamp())
        rates.append(
            Rates(
                input=to_micros(price.input_per_million),
                cached_input=to_micros(price.cached_input_per_million),
                output=to_micros(price.output_per_million),
                batch_percent=100 - price.batch_discount_percent,
            )
        )
    return PriceBook(
        version=version,
        schedules={
            version_id: Schedule(tuple(starts), tuple(rates))
            for version_id, (starts, rates) in rows.items()
        },
    )
