"""Writes for the usage ledger: flush the buffer into records and daily rollups; replay, prune."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from apps.billing import ledger
from apps.billing.choices import UsageStatus
from apps.billing.models import UsageDaily, UsageRecord
from apps.billing.money import from_micros
from apps.billing.services.balances import Charge, usage_charges
from dmxplatform import streams
from dmxplatform.redis_client import request_redis

# What a daily rollup adds up.
_ROLLED_UP = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")
# A rollup row's key, in the order _usage_rollup builds it, and its totals per statement (at
# 11 parameters each, well inside SQLite's 32,766 and PostgreSQL's 65,535).
_ROLLUP_KEY = ("day", "api_key_id", "tenant_id", "model", "batch")
ROLLUP_ROWS = 1_000
# Rows deleted per statement when pruning: small enough not to hold long locks.
USAGE_PRUNE_BATCH = 10_000


def _usage_row(event: ledger.UsageEvent) -> dict[str, Any]:
    """The event's usage record, column by column."""
    return {
        "request_id": event.request_id,
        "api_key_id": event.api_key_id,
        "tenant_id": event.tenant_id,
        "created_at": datetime.fromtimestamp(event.created_at, tz=UTC),
        "endpoint": event.endpoint,
        "model": event.model,
        "model_version": event.model_version,
        "node": event.node,
        "intent": event.intent,
        "intent_confidence": event.intent_confidence,
        "intent_low_confidence": event.intent_low_confidence,
        "stream": event.stream,
        "status": event.status,
        "http_status": event.http_status,
        "error_code": event.error_code,
        "prompt_tokens": event.prompt_tokens,
        "cached_tokens": event.cached_tokens,
        "completion_tokens": event.completion_tokens,
        "cost": from_micros(event.cost_micros),
        "duration_ms": event.duration_ms,
        "time_to_first_token_ms": event.time_to_first_token_ms,
        "estimated_prompt_tokens": event.estimated_prompt_tokens,
        "context_limit": event.context_limit,
        "content_flags": event.content_flags,
        "timings": event.timings,
        "client_request_id": event.client_request_id,
        "trace_id": event.trace_id,
        "batch_id": event.batch_id,
    }


def _usage_rollup(rows: list[dict[str, Any]]) -> None:
    """Add rows to their (day, key, model, batch or not) totals; runs in the rows' own
    transaction. One upsert statement per ROLLUP_ROWS totals (INSERT ... ON CONFLICT DO UPDATE,
    adding to the stored totals): a drain's batch of many keys' requests touches hundreds of
    totals, and an UPDATE (then an INSERT) per total was most of the drain's CPU on
    bench/realistic.py's thousand keys."""
    totals: dict[tuple, dict[str, Any]] = defaultdict(lambda: dict.fromkeys(_ROLLED_UP, 0))
    for row in rows:
        total = totals[
            (
                row["created_at"].date(),
                row["api_key_id"],
                row["tenant_id"],
                row["model"],
                bool(row["batch_id"]),
            )
        ]
        total["requests"] += 1
        total["errors"] += row["status"] != UsageStatus.OK
        total["prompt_tokens"] += row["prompt_tokens"]
        total["cached_tokens"] += row["cached_tokens"]
        total["completion_tokens"] += row["completion_tokens"]
        total["cost"] += row["cost"]
    quote = connection.ops.quote_name
    table = quote(UsageDaily._meta.db_table)
    columns = ", ".join(map(quote, _ROLLUP_KEY + _ROLLED_UP))
    added = ", ".join(f"{quote(n)} = {table}.{quote(n)} + EXCLUDED.{quote(n)}" for n in _ROLLED_UP)
    row_marks = "(" + ", ".join(["%s"] * (len(_ROLLUP_KEY) + len(_ROLLED_UP))) + ")"
    unique = ", ".join(map(quote, ("day", "api_key_id", "model", "batch")))  # usage_daily_unique
    items = list(totals.items())
    with connection.cursor() as cursor:
        for chunk in (items[i : i + ROLLUP_ROWS] for i in range(0, len(items), ROLLUP_ROWS)):
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {', '.join([row_marks] * len(chunk))} "
                f"ON CONFLICT ({unique}) DO UPDATE SET {added}",
                [value for key, total in chunk for value in (*key, *total.values())],
            )


def _usage_insert(entries: list[tuple[bytes, ledger.UsageEvent]]) -> None:
    """Store events not stored before, with their daily totals, in the caller's transaction.

    Only one flush runs at a time (streams.drain's lock), so "not stored before" read here
    still holds when the rows are written, and a redelivered event is neither stored nor
    counted twice. A row that cannot be stored fails the batch; streams.drain then finds it.
    """
    fresh: dict[str, ledger.UsageEvent] = {}
    for _, event in entries:
        fresh.setdefault(event.request_id, event)
    for request_id in _stored_request_ids(list(fresh)):
        del fresh[request_id]
    rows = [_usage_row(event) for event in fresh.values()]
    _check_constraints_now()
    _copy_rows(rows)
    _usage_rollup(rows)
    # Prepaid requests' charges, with their records: a record and its charge are stored together
    # or not at all (once each: a batch may hold a redelivered event twice).
    usage_charges(
        Charge(event.tenant_id, event.request_id, event.cost_micros)
        for event in fresh.values()
        if event.prepaid
    )


def _stored_request_ids(request_ids: list[str]) -> list[str]:
    """Which of these requests have their record already. On PostgreSQL with one array
    parameter: psycopg spends milliseconds splitting a query of 500 placeholders, a tenth of
    the drain's CPU."""
    if connection.vendor != "postgresql":
        return list(
            UsageRecord.objects.filter(request_id__in=request_ids).values_list(
                "request_id", flat=True
            )
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT request_id FROM {UsageRecord._meta.db_table} WHERE request_id = ANY(%s)",
            [request_ids],
        )
        return [row[0] for row in cursor.fetchall()]


# Columns stored as JSON: psycopg is told so (Jsonb), with orjson's encoding.
_JSON_COLUMNS = frozenset({"content_flags", "timings"})


def _copy_rows(rows: list[dict[str, Any]]) -> None:
    """Insert usage records with PostgreSQL's COPY. bulk_create spent most of the drain's CPU
    preparing every field of every row: with COPY a record costs about a quarter of what it
    did (bench/capacity.py's ledger drain). Other databases (the benchmark's SQLite) get
    bulk_create. psycopg's errors become Django's, so that streams.drain tells a bad entry
    (DataError, IntegrityError) from an outage."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        UsageRecord.objects.bulk_create([UsageRecord(**row) for row in rows])
        return
    names = list(rows[0])
    quote, field = connection.ops.quote_name, UsageRecord._meta.get_field  # field by attname too
    columns = ", ".join(quote(field(name).column) for name in names)
    json_at = [i for i, name in enumerate(names) if name in _JSON_COLUMNS]
    sql = f"COPY {quote(UsageRecord._meta.db_table)} ({columns}) FROM STDIN"
    with (
        connection.wrap_database_errors,
        connection.cursor() as cursor,
        cursor.cursor.copy(sql) as copy,
    ):
        for row in rows:
            values = list(row.values())
            for i in json_at:
                values[i] = Jsonb(values[i], dumps=_json_text)
            copy.write_row(values)


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def usage_prune(*, older_than_days: int, batch_size: int = USAGE_PRUNE_BATCH) -> int:
    """Delete raw usage records past retention, in batches; daily totals are kept."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted = 0
    while True:
        ids = list(
            UsageRecord.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[
                :batch_size
            ]
        )
        if not ids:
            return deleted
        deleted += UsageRecord.objects.filter(id__in=ids).delete()[0]


def _check_constraints_now() -> None:
    """Make PostgreSQL check foreign keys at insert, not at commit (Django defers them), so a
    row that refers to something deleted fails its own attempt even inside an outer
    transaction, and streams.drain can tell it from the rest of its batch."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _usage_store(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """Store usage events drained from the buffer; return why the unreadable ones are."""
    decoded = []
    unreadable = {}
    for entry_id, payload in pairs:
        try:
            decoded.append((entry_id, ledger.UsageEvent.decode(payload)))
        except (TypeError, ValueError) as exc:
            unreadable[entry_id] = f"unreadable usage event: {exc}"
    _usage_insert(decoded)
    return unreadable


def usage_replay(lines: Iterable[str]) -> tuple[int, int]:
    """Append the usage events gateways could only log (`usage-unrecorded <json>` lines, when
    Redis failed mid-request) to the usage stream again; returns (appended, unreadable).

    The flush stores each request once, so replaying an event that did arrive is harmless."""
    events, unreadable = [], 0
    for line in lines:
        _, mark, raw = _log_message(line).partition(ledger.UNRECORDED + " ")
        if not mark:
            continue  # any other log line
        try:
            events.append(ledger.UsageEvent.decode(raw.strip()))
        except (ValueError, TypeError):  # orjson's JSONDecodeError is a ValueError
            unreadable += 1
    pipe = request_redis().pipeline(transaction=False)
    for event in events:
        pipe.xadd(
            ledger.USAGE_STREAM.of_tenant(event.tenant_id).key(), {streams.FIELD: event.encode()}
        )
    pipe.execute()
    return len(events), unreadable


def _log_message(line: str) -> str:
    """The message of a log line: a JSON line's `message` field (DMX_LOG_FORMAT=json), else the
    line itself (plain text, whose message ends it). The JSON object may come after a prefix a
    log collector added (journalctl's date and unit, a container runtime's stream name)."""
    start = line.find("{")
    if start >= 0:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            message = orjson.loads(line[start:]).get("message")
            if message is not None:  # a plain line's first brace opens the usage event instead
                return str(message)
    return line


def usage_flush(
    *, shard: int | None = None, consumer: str = "flusher", batch_size: int = streams.BATCH
) -> int:
    """Move buffered usage events (of one shard's stream, or of all) into PostgreSQL; return
    how many left the buffer."""
    return streams.flush(
        ledger.USAGE_STREAM, _usage_store, shard=shard, consumer=consumer, batch_size=batch_size
    )
