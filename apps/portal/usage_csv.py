"""Raw usage records as CSV, streamed: rows are read from the database in chunks and written
out as they come, so that a month of records never sits in memory.

New columns go at the end, so that a reader that takes columns by position keeps working; a
record's cost is its stored Decimal (six places) in the platform's currency, never a float.
"""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator

from django.conf import settings
from django.db.models import QuerySet

from apps.billing.models import UsageRecord

# Rows fetched per round trip: large enough that a month of records is a few hundred
# queries, small enough that a chunk stays a few megabytes.
CHUNK_ROWS = 2_000

COLUMNS = (
    "request_id",
    "created_at",
    "key_id",
    "key_name",
    "endpoint",
    "model",
    "model_version",
    "stream",
    "status",
    "http_status",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "duration_ms",
    "time_to_first_token_ms",
    "cached_tokens",  # of prompt_tokens, served from the engine's prefix cache
    "cost",
    "currency",
    "batch_id",  # the batch (/v1/batches) it ran in, at the batch price; empty otherwise
)


class _Line:
    """A file-like object csv.writer writes one line into, handed straight back."""

    def write(self, value: str) -> str:
        return value


def _row(record: UsageRecord, currency: str) -> list:
    return [
        record.request_id,
        record.created_at.isoformat(),
        record.api_key.key_id,
        record.api_key.name,
        record.endpoint,
        record.model,
        record.model_version,
        record.stream,
        record.status,
        record.http_status,
        record.error_code,
        record.prompt_tokens,
        record.completion_tokens,
        record.total_tokens,
        record.duration_ms,
        "" if record.time_to_first_token_ms is None else record.time_to_first_token_ms,
        record.cached_tokens,
        record.cost,
        currency,
        record.batch_id,
    ]


async def usage_csv_lines(records: QuerySet[UsageRecord]) -> AsyncIterator[str]:
    """The header, then one line per record, read CHUNK_ROWS at a time.

    Asynchronous on purpose: the portal is served over ASGI, where Django would first read a
    synchronous iterator to its end (into a list) before sending a byte.
    """
    writer = csv.writer(_Line())
    currency = settings.DMX_CURRENCY
    yield writer.writerow(COLUMNS)
    async for record in records.aiterator(chunk_size=CHUNK_ROWS):
        yield writer.writerow(_row(record, currency))
