"""Sensitive terms as CSV, one term a row: `term,category,action`, with or without that header.

What operators upload and download in the admin and the management API; reading never raises
on what a file holds: each row that cannot be a term comes back as a RowError with its line.
A cell that a spreadsheet would run as a formula is written behind a single quote (OWASP's
advice against CSV injection), and read back without it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass

from apps.gateway.choices import SensitiveTermAction
from apps.gateway.content_filter import DEFAULT_CATEGORY
from apps.gateway.models import SensitiveTerm

COLUMNS = ("term", "category", "action")
# Some thousands of terms are a few hundred kilobytes; a file this large is not a term list.
MAX_CSV_BYTES = 5 * 1024 * 1024
# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"


@dataclass(frozen=True, slots=True)
class TermRow:
    term: str
    category: str = DEFAULT_CATEGORY
    action: str = SensitiveTermAction.BLOCK


@dataclass(frozen=True, slots=True)
class RowError:
    line: int  # 0: the file as a whole
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


def _needs_quote(cell: str) -> bool:
    # Quotes already in front count: "'=x" is written as "''=x" so that it reads back as it was.
    return cell.lstrip(QUOTE).startswith(FORMULA_STARTS)


def neutralise(cell: str) -> str:
    """The cell as a spreadsheet shows it as text, never runs it."""
    return QUOTE + cell if _needs_quote(cell) else cell


def unneutralise(cell: str) -> str:
    """The cell that neutralise was given (a cell it left alone comes back as it is)."""
    return cell[1:] if cell.startswith(QUOTE) and _needs_quote(cell[1:]) else cell


def read_terms(data: bytes) -> tuple[list[tuple[int, TermRow]], list[RowError]]:
    """The rows of a CSV file, each with its line number, and what could not be read."""
    if len(data) > MAX_CSV_BYTES:
        return [], [RowError(0, f"The file is over {MAX_CSV_BYTES // (1024 * 1024)} MB.")]
    try:
        text = data.decode("utf-8-sig")  # spreadsheets save UTF-8 with a byte-order mark
    except UnicodeDecodeError as exc:
        return [], [RowError(0, f"The file is not UTF-8 text: {exc.reason} at byte {exc.start}.")]
    reader = csv.reader(io.StringIO(text, newline=""))
    rows, errors = [], []
    try:
        for cells in reader:
            line = reader.line_num
            cells = [unneutralise(cell.strip()) for cell in cells]
            if not any(cells):
                continue
            if line == 1 and cells[0].lower() == COLUMNS[0]:
                continue  # the header
            if len(cells) > len(COLUMNS):
                errors.append(RowError(line, f"Expected {', '.join(COLUMNS)}: {len(cells)} cells."))
                continue
            term, category, action = (*cells, "", "")[: len(COLUMNS)]
            rows.append(
                (
                    line,
                    TermRow(
                        term=term,
                        category=category or DEFAULT_CATEGORY,
                        action=action.lower() or SensitiveTermAction.BLOCK,
                    ),
                )
            )
    except csv.Error as exc:
        errors.append(RowError(reader.line_num, f"Not CSV from here on: {exc}."))
    return rows, errors


def write_terms(terms: Iterable[SensitiveTerm | TermRow]) -> str:
    """CSV that read_terms reads back into the same rows, header first."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    writer.writerows(
        (neutralise(term.term), neutralise(term.category), term.action) for term in terms
    )
    return out.getvalue()
