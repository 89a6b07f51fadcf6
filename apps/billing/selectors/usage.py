"""Reads of usage: raw records, the daily rollups and their series, the last hour per minute."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connections
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from apps.billing.choices import UsageStatus
from apps.billing.models import UsageDaily, UsageRecord
from dmxplatform.aggregates import Percentile, percentile


def usage_records_of(
    *,
    tenant_id: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[UsageRecord]:
    """A tenant's raw usage records, newest first, in [since, until)."""
    records = UsageRecord.objects.filter(tenant_id=tenant_id)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    return records.select_related("api_key")


def usage_records_search(
    *,
    request_id: str = "",
    client_request_id: str = "",
    key_id: str = "",
    tenant: str = "",
    model: str = "",
    status: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[UsageRecord]:
    """Every tenant's usage records that match all the criteria given, newest first: the
    operator console's request search. A key by the first characters of its public id; a
    tenant by slug or name."""
    records = UsageRecord.objects.select_related("api_key", "tenant").order_by("-created_at")
    if request_id:
        records = records.filter(request_id=request_id)
    if client_request_id:
        records = records.filter(client_request_id=client_request_id)
    if key_id:
        records = records.filter(api_key__key_id__startswith=key_id)
    if tenant:
        records = records.filter(Q(tenant__slug=tenant) | Q(tenant__name__iexact=tenant))
    if model:
        records = records.filter(model=model)
    if status:
        records = records.filter(status=status)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    return records


@dataclass(frozen=True, slots=True)
class KeyUsageColumns:
    """Expressions a key's queryset annotates itself with (keys' list of a tenant's keys)."""

    last_used_at: Subquery
    month_tokens: Coalesce


def key_usage_columns(*, key: OuterRef) -> KeyUsageColumns:
    """When the key `key` refers to was last used, and its tokens this calendar month (UTC)
    from the daily rollups: one subquery each, for any number of keys."""
    month_start = timezone.now().date().replace(day=1)
    last_used = UsageRecord.objects.filter(api_key=key).order_by("-created_at")
    month = (
        UsageDaily.objects.filter(api_key=key, day__gte=month_start)
        .values("api_key")
        .annotate(total=Sum(F("prompt_tokens") + F("completion_tokens")))
        .values("total")
    )
    return KeyUsageColumns(
        last_used_at=Subquery(last_used.values("created_at")[:1]),
        month_tokens=Coalesce(Subquery(month), 0),
    )


def usage_record_find(*, request_id: str) -> UsageRecord | None:
    """One request's usage record, by the id the gateway returned (X-Request-Id)."""
    return (
        UsageRecord.objects.select_related("api_key", "tenant")
        .filter(request_id=request_id)
        .first()
    )


def usage_daily_of(*, tenant_id: int, since: date | None = None) -> QuerySet[UsageDaily]:
    days = UsageDaily.objects.filter(tenant_id=tenant_id)
    return days.filter(day__gte=since) if since else days


@dataclass(frozen=True)
class DailySeries:
    """Requests, tokens and cost per day (every day of the window, zeros included) and per
    model; cost is a Decimal in DMX_CURRENCY, the sum of the records' own costs."""

    days: list[date]
    requests: list[int]
    tokens: list[int]
    tokens_by_model: dict[str, list[int]]
    cached_tokens: list[int]
    cost: list[Decimal]
    cost_by_model: dict[str, list[Decimal]]


def usage_daily_series(*, tenant_id: int, days: int = 30) -> DailySeries:
    """The last `days` UTC days of a tenant's usage, from the daily rollups."""
    today = timezone.now().date()
    window = [today - timedelta(days=n) for n in range(days - 1, -1, -1)]
    index = {day: i for i, day in enumerate(window)}
    requests, tokens, cached = [0] * days, [0] * days, [0] * days
    cost = [Decimal(0)] * days
    by_model: dict[str, list[int]] = {}
    cost_by_model: dict[str, list[Decimal]] = {}
    rows = (
        usage_daily_of(tenant_id=tenant_id, since=window[0])
        .values("day", "model")
        .annotate(
            requests_sum=Sum("requests"),
            tokens_sum=Sum(F("prompt_tokens") + F("completion_tokens")),
            cached_sum=Sum("cached_tokens"),
            cost_sum=Sum("cost"),
        )
    )
    for row in rows:
        i = index[row["day"]]
        requests[i] += row["requests_sum"]
        tokens[i] += row["tokens_sum"]
        cached[i] += row["cached_sum"]
        cost[i] += row["cost_sum"]
        by_model.setdefault(row["model"], [0] * days)[i] += row["tokens_sum"]
        cost_by_model.setdefault(row["model"], [Decimal(0)] * days)[i] += row["cost_sum"]
    return DailySeries(
        days=window,
        requests=requests,
        tokens=tokens,
        tokens_by_model=by_model,
        cached_tokens=cached,
        cost=cost,
        cost_by_model=cost_by_model,
    )


def usage_by_key(*, tenant_id: int, since: date) -> QuerySet:
    """Per key since a day: requests, errors, tokens (cached among the prompt's) and cost,
    most tokens first."""
    return (
        usage_daily_of(tenant_id=tenant_id, since=since)
        .values("api_key__key_id", "api_key__name")
        .annotate(
            # First: after the two below, these names mean their sums, not the columns.
            total_tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            requests=Sum("requests"),
            errors=Sum("errors"),
            prompt_tokens=Sum("prompt_tokens"),
            cached_tokens=Sum("cached_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cost=Sum("cost"),
        )
        .order_by("-total_tokens")
    )


# The operator console's charts: the last hour of every model's traffic, a point a minute.
USAGE_MINUTES = 60
LATENCY_PERCENTILE = 0.95
# A minute's rates are per second; a minute still running has run this long at least (a rate over
# its first milliseconds would be a spike of chance).
RUNNING_MINUTE_MIN_SECONDS = 1.0


@dataclass(frozen=True)
class ModelMinutes:
    """One model's figures per minute, aligned with MinuteSeries.minutes: rates are 0 in a
    minute without requests, the others None (nothing was measured)."""

    requests: list[int]
    requests_per_second: list[float]
    tokens_per_second: list[float]  # completion tokens
    error_rate: list[float | None]  # 0..1
    ttft_p95_ms: list[float | None]
    e2e_p95_ms: list[float | None]


@dataclass(frozen=True)
class MinuteSeries:
    minutes: list[datetime]  # the start of each minute, oldest first, the running one last
    models: dict[str, ModelMinutes]  # the models with requests in the window, by name


def usage_minute_series(
    *, now: datetime | None = None, minutes: int = USAGE_MINUTES
) -> MinuteSeries:
    """Every model's requests over the last `minutes` minutes, per minute, in one query: requests
    and completion tokens per second, the error rate (what did not end ok, as the daily rollups
    count errors) and the P95 time to first token and end-to-end latency of the requests that
    did. The running minute's rates are over the seconds it has run, so that the last point
    does not read as a drop in traffic."""
    moment = now or timezone.now()
    axis = [
        moment.replace(second=0, microsecond=0) - timedelta(minutes=back)
        for back in range(minutes - 1, -1, -1)
    ]
    index = {minute: i for i, minute in enumerate(axis)}
    seconds = [60.0] * minutes
    seconds[-1] = max((moment - axis[-1]).total_seconds(), RUNNING_MINUTE_MIN_SECONDS)
    ok = Q(status=UsageStatus.OK)
    records = UsageRecord.objects.filter(created_at__gte=axis[0], created_at__lte=moment)
    figures = {
        "requests": Count("id"),
        "errors": Count("id", filter=~ok),
        "tokens": Coalesce(Sum("completion_tokens"), 0),
    }
    postgresql = connections[records.db].vendor == "postgresql"
    if postgresql:
        figures["ttft_p95"] = Percentile(
            "time_to_first_token_ms", fraction=LATENCY_PERCENTILE, filter=ok
        )
        figures["e2e_p95"] = Percentile("duration_ms", fraction=LATENCY_PERCENTILE, filter=ok)
    rows = list(
        records.annotate(minute=TruncMinute("created_at"))
        .values("model", "minute")
        .annotate(**figures)
        .order_by()
    )
    if not postgresql:
        _percentiles_in_python(records.filter(ok), rows)
    models: dict[str, ModelMinutes] = {}
    for row in rows:
        series = models.get(row["model"])
        if series is None:
            series = models[row["model"]] = ModelMinutes(
                requests=[0] * minutes,
                requests_per_second=[0.0] * minutes,
                tokens_per_second=[0.0] * minutes,
                error_rate=[None] * minutes,
                ttft_p95_ms=[None] * minutes,
                e2e_p95_ms=[None] * minutes,
            )
        i = index[row["minute"]]
        series.requests[i] = row["requests"]
        series.requests_per_second[i] = row["requests"] / seconds[i]
        series.tokens_per_second[i] = row["tokens"] / seconds[i]
        series.error_rate[i] = row["errors"] / row["requests"]
        series.ttft_p95_ms[i] = row["ttft_p95"]
        series.e2e_p95_ms[i] = row["e2e_p95"]
    return MinuteSeries(minutes=axis, models=dict(sorted(models.items())))


def _percentiles_in_python(ok: QuerySet[UsageRecord], rows: list[dict]) -> None:
    """Add the P95s to `rows` where the database has no percentile_cont (SQLite, on a laptop
    without PostgreSQL: its hour of requests fits in memory)."""
    samples: defaultdict[tuple[str, datetime], tuple[list[float], list[float]]] = defaultdict(
        lambda: ([], [])
    )
    for model, minute, ttft, duration in ok.annotate(minute=TruncMinute("created_at")).values_list(
        "model", "minute", "time_to_first_token_ms", "duration_ms"
    ):
        ttfts, durations = samples[model, minute]
        if ttft is not None:
            ttfts.append(ttft)
        durations.append(duration)
    for row in rows:
        ttfts, durations = samples.get((row["model"], row["minute"]), ([], []))
        row["ttft_p95"] = percentile(ttfts, fraction=LATENCY_PERCENTILE)
        row["e2e_p95"] = percentile(durations, fraction=LATENCY_PERCENTILE)


@dataclass(frozen=True)
class IntentFigures:
    """One intent's requests over the console's window (usage_by_intent)."""

    intent: str
    requests: int
    # Of them, the share whose label was under DMX_INTENT_MIN_CONFIDENCE (an alias routed
    # them by its default route), 0..1.
    low_confidence_share: float
    ttft_p95_ms: float | None
    e2e_p95_ms: float | None


def usage_by_intent(
    *, now: datetime | None = None, minutes: int = USAGE_MINUTES
) -> list[IntentFigures]:
    """Each intent's requests over the last `minutes` minutes, most first: how many, the share
    the classifier was unsure of, and the P95 time to first token and end-to-end latency of
    those that ended ok. Requests without an intent (embeddings, refusals before it) are left
    out."""
    moment = now or timezone.now()
    since = moment - timedelta(minutes=minutes)
    records = UsageRecord.objects.filter(created_at__gte=since, created_at__lte=moment).exclude(
        intent=""
    )
    ok = Q(status=UsageStatus.OK)
    figures = {"requests": Count("id"), "low": Count("id", filter=Q(intent_low_confidence=True))}
    postgresql = connections[records.db].vendor == "postgresql"
    if postgresql:
        figures["ttft_p95"] = Percentile(
            "time_to_first_token_ms", fraction=LATENCY_PERCENTILE, filter=ok
        )
        figures["e2e_p95"] = Percentile("duration_ms", fraction=LATENCY_PERCENTILE, filter=ok)
    rows = list(records.values("intent").annotate(**figures).order_by())
    if not postgresql:
        samples: defaultdict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
        for intent, ttft, duration in records.filter(ok).values_list(
            "intent", "time_to_first_token_ms", "duration_ms"
        ):
            ttfts, durations = samples[intent]
            if ttft is not None:
                ttfts.append(ttft)
            durations.append(duration)
        for row in rows:
            ttfts, durations = samples.get(row["intent"], ([], []))
            row["ttft_p95"] = percentile(ttfts, fraction=LATENCY_PERCENTILE)
            row["e2e_p95"] = percentile(durations, fraction=LATENCY_PERCENTILE)
    return sorted(
        (
            IntentFigures(
                intent=row["intent"],
                requests=row["requests"],
                low_confidence_share=row["low"] / row["requests"],
                ttft_p95_ms=row["ttft_p95"],
                e2e_p95_ms=row["e2e_p95"],
            )
            for row in rows
        ),
        key=lambda figures: (-figures.requests, figures.intent),
    )


def usage_of_batches(*, batch_ids: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """What the batches' requests used and cost so far, per batch and node: requests, tokens
    and cost from their usage records (those the flush has stored)."""
    rows = (
        UsageRecord.objects.filter(batch_id__in=batch_ids)
        .values("batch_id", "node")
        .annotate(
            requests=Count("id"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cost=Sum("cost"),
        )
        .order_by("batch_id", "node")
    )
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        found.setdefault(row.pop("batch_id"), {})[row.pop("node") or "-"] = row
    return found
