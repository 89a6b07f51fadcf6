"""Percentiles of the usage ledger: in SQL where the database has them (PostgreSQL), in Python
where it has not (SQLite, on a laptop without PostgreSQL)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from django.db.models import Aggregate, FloatField


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont: interpolated, as statistics.quantiles(method="inclusive").

    NULLs are left out, as by every aggregate; `filter` narrows the rows as for Count or Sum.
    """

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: str, *, fraction: float, **extra) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(values: Sequence[float], *, fraction: float) -> float | None:
    """What Percentile computes, over values in memory; `fraction` a whole percent (0.95)."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]
