"""A monthly statement as the portal gives it: the totals row under the lines, and the CSV: one
row per model, the total, then the month's balance movements by kind, all in one table so that
a spreadsheet filters it by its first column.

Amounts are written as the exact decimals the statement holds (six places), never floats: a
spreadsheet's sum of the model rows equals the total row.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from apps.billing.selectors import Statement

COLUMNS = (
    "line",  # model, batch (a model's requests of batches), total, or movement
    "month",
    "model",  # the model's name; a movement's kind
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost",  # a model's or the total's cost; a movement's amount (credits positive)
    "currency",
)


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: Decimal  # the statement's own total


def statement_totals(statement: Statement) -> Totals:
    lines = statement.lines
    return Totals(
        requests=sum(line.requests for line in lines),
        prompt_tokens=sum(line.prompt_tokens for line in lines),
        cached_tokens=sum(line.cached_tokens for line in lines),
        completion_tokens=sum(line.completion_tokens for line in lines),
        cost=statement.total,
    )


def statement_csv(statement: Statement) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    month = f"{statement.month:%Y-%m}"
    currency = settings.DMX_CURRENCY
    for line in statement.lines:
        writer.writerow(
            [
                "batch" if line.batch else "model",
                month,
                line.model,
                line.requests,
                line.prompt_tokens,
                line.cached_tokens,
                line.completion_tokens,
                line.cost,
                currency,
            ]
        )
    totals = statement_totals(statement)
    writer.writerow(
        [
            "total",
            month,
            "",
            totals.requests,
            totals.prompt_tokens,
            totals.cached_tokens,
            totals.completion_tokens,
            totals.cost,
            currency,
        ]
    )
    for kind, amount in sorted(statement.movements.items()):
        writer.writerow(["movement", month, kind, "", "", "", "", amount, currency])
    return out.getvalue()
