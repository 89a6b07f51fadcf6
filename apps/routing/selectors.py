"""Reads for routing: the routing table, canary figures, breakers, the usage behind nightly
weights."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.db.models import Aggregate, Count, FloatField, QuerySet
from django.utils import timezone

from apps.billing.choices import UsageStatus
from apps.billing.models import UsageRecord
from apps.hardware.models import Node
from apps.hardware.nodestate import now
from apps.hardware.resources import summarize
from apps.models.models import ModelVersion
from apps.routing.breaker import Breaker, BreakerState, breakers_key
from apps.routing.models import Canary, RoutingDecision, RoutingRule, WorkProfile
from apps.routing.table import Route, RoutingTable
from apps.routing.work import INTENT_MIN_REQUESTS, KEY_MIN_REQUESTS, WorkFigures, WorkTable
from dmxplatform.redis_client import request_redis


def routing_table_load(*, version: int) -> RoutingTable:
    """The active rules by alias and intent, heaviest first."""
    aliases: dict[str, dict[str, list[Route]]] = defaultdict(lambda: defaultdict(list))
    rules = RoutingRule.objects.filter(is_active=True, model__is_active=True).select_related(
        "model"
    )
    for rule in rules.order_by("alias", "intent", "-weight", "id"):
        aliases[rule.alias][rule.intent].append(
            Route(
                model=rule.model.name,
                weight=rule.weight,
                preferred_profiles=frozenset(rule.hardware_preference or ()),
                tier=rule.tier,
            )
        )
    return RoutingTable(
        version=version,
        aliases={
            alias: {i: tuple(r) for i, r in intents.items()} for alias, intents in aliases.items()
        },
        work=work_table_load(),
    )


def work_table_load() -> WorkTable:
    """The work profiles as the router looks them up."""
    by_intent: dict[tuple[str, str], WorkFigures] = {}
    by_key: dict[tuple[str, str, int], WorkFigures] = {}
    for row in WorkProfile.objects.all():
        figures = WorkFigures(
            requests=row.requests,
            completion_p50=row.completion_p50,
            completion_p95=row.completion_p95,
            ttft_p50_ms=row.ttft_p50_ms,
            ttft_p95_ms=row.ttft_p95_ms,
            latency_p50_ms=row.latency_p50_ms,
            latency_p95_ms=row.latency_p95_ms,
        )
        if row.api_key_id is None:
            by_intent[(row.model, row.intent)] = figures
        else:
            by_key[(row.model, row.intent, row.api_key_id)] = figures
    return WorkTable(by_intent=by_intent, by_key=by_key)


class _Percentile(Aggregate):
    """PostgreSQL's continuous percentile of a column over a group (NULLs left out)."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: str, fraction: float) -> None:
        super().__init__(expression, fraction=fraction)


_QUANTILES = {
    "completion_p50": ("completion_tokens", 0.5),
    "completion_p95": ("completion_tokens", 0.95),
    "ttft_p50_ms": ("time_to_first_token_ms", 0.5),
    "ttft_p95_ms": ("time_to_first_token_ms", 0.95),
    "latency_p50_ms": ("duration_ms", 0.5),
    "latency_p95_ms": ("duration_ms", 0.95),
}


@dataclass(frozen=True, slots=True)
class WorkGroup:
    model: str
    intent: str  # "" for every intent
    api_key_id: int | None  # None for every key
    figures: WorkFigures


def work_groups(*, since: datetime) -> list[WorkGroup]:
    """The ledger's figures since a moment: per model and intent, per model (intent ""), and
    per model, intent and key for keys with KEY_MIN_REQUESTS or more; of the generating
    requests that succeeded (an error or a refusal says nothing of how long an answer is)."""
    records = UsageRecord.objects.filter(created_at__gte=since, status=UsageStatus.OK).exclude(
        endpoint="embeddings"
    )
    groups = []
    for fields, least in (
        (("model",), INTENT_MIN_REQUESTS),
        (("model", "intent"), INTENT_MIN_REQUESTS),
        (("model", "intent", "api_key_id"), KEY_MIN_REQUESTS),
    ):
        for row in _group_figures(records, fields, least):
            groups.append(
                WorkGroup(
                    model=row["model"],
                    intent=row.get("intent", ""),
                    api_key_id=row.get("api_key_id"),
                    figures=WorkFigures(
                        requests=row["requests"],
                        completion_p50=round(row["completion_p50"]),
                        completion_p95=round(row["completion_p95"]),
                        ttft_p50_ms=row["ttft_p50_ms"],
                        ttft_p95_ms=row["ttft_p95_ms"],
                        latency_p50_ms=row["latency_p50_ms"],
                        latency_p95_ms=row["latency_p95_ms"],
                    ),
                )
            )
    return groups


def _group_figures(records: QuerySet[UsageRecord], fields: tuple[str, ...], least: int) -> list:
    """Per group of `fields` with `least` records or more: the count and the quantiles."""
    if connection.vendor == "postgresql":  # the database computes them: one pass, no rows out
        return list(
            records.values(*fields)
            .annotate(
                requests=Count("id"),
                **{name: _Percentile(column, q) for name, (column, q) in _QUANTILES.items()},
            )
            .filter(requests__gte=least)
        )
    # Elsewhere (SQLite on a laptop), in Python.
    columns = sorted({column for column, _ in _QUANTILES.values()})
    values: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in records.values(*fields, *columns).iterator():
        group = values[tuple(row[f] for f in fields)]
        for column in columns:
            if row[column] is not None:
                group[column].append(row[column])
    found = []
    for key, group in values.items():
        requests = len(group["completion_tokens"])
        if requests < least:
            continue
        row = dict(zip(fields, key, strict=True), requests=requests)
        for name, (column, q) in _QUANTILES.items():
            row[name] = _quantile(group[column], q)
        found.append(row)
    return found


def _quantile(values: list[float], q: float) -> float | None:
    """PERCENTILE_CONT's interpolated quantile."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class VersionFigures:
    requests: int
    errors: int
    latency_p95_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "latency_p95_ms": self.latency_p95_ms,
        }


def canaries_running() -> QuerySet[Canary]:
    """The versions taking canary traffic now."""
    return Canary.objects.filter(is_stable=False, canary_percent__gt=0).select_related("model")


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def served_records(*, model: str, since: datetime) -> QuerySet[UsageRecord]:
    """Requests that reached a node: refusals before routing say nothing about a version."""
    return UsageRecord.objects.filter(model=model, created_at__gte=since).exclude(
        status=UsageStatus.REJECTED, node=""
    )


def version_figures(*, version: ModelVersion, since: datetime) -> VersionFigures:
    """Requests, upstream failures and P95 latency of one version since a moment."""
    rows = list(
        served_records(model=version.model.name, since=since)
        .filter(model_version=version.tag)
        .values_list("status", "duration_ms")
    )
    errors = sum(1 for status, _ in rows if status == UsageStatus.UPSTREAM_ERROR)
    latencies = [duration for status, duration in rows if status == UsageStatus.OK]
    return VersionFigures(requests=len(rows), errors=errors, latency_p95_ms=p95(latencies))


def canary_step_figures(*, version: ModelVersion) -> VersionFigures:
    """A canary's figures over its ramp's current step (the step a canary started before ramps
    existed has run since its start)."""
    since = version.canary_step_started_at or version.canary_started_at or timezone.now()
    return version_figures(version=version, since=since)


@dataclass(frozen=True, slots=True)
class BreakerView:
    state: BreakerState
    failures: int
    opened_at: datetime | None


CLOSED_BREAKER = BreakerView(state=BreakerState.CLOSED, failures=0, opened_at=None)


def node_breakers() -> dict[int, BreakerView]:
    """Every node's circuit breaker as gateways see it in Redis now, by node id; a node not
    in it has a closed breaker (CLOSED_BREAKER)."""
    moment = now()
    breakers = {}
    for node, raw in request_redis().hgetall(breakers_key()).items():
        breaker = Breaker.parse(raw)
        breakers[int(node)] = BreakerView(
            state=breaker.current(moment, settings.DMX_BREAKER_COOLDOWN_SECONDS),
            failures=breaker.failures,
            opened_at=(
                datetime.fromtimestamp(breaker.opened_at, tz=UTC) if breaker.opened_at else None
            ),
        )
    return breakers


def node_hourly_prices() -> dict[str, float]:
    """USD per hour of each node, by name: its profile's price for each of its GPUs."""
    prices = {}
    for node in Node.objects.select_related("profile"):
        summary = summarize(node.resources)
        gpus = max(int(summary.get("gpu_count", 0)), 1)
        if node.profile is not None:
            prices[node.name] = float(node.profile.hourly_price_usd) * gpus
        else:
            prices[node.name] = float(summary.get("hourly_price_usd", 0.0))
    return prices


@dataclass(frozen=True, slots=True)
class RouteFigures:
    """What a routing rule's model did for its intent over a window."""

    requests: int
    errors: int
    latency_p95_ms: float | None
    cost_per_1k_tokens: float | None

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "latency_p95_ms": self.latency_p95_ms,
            "cost_per_1k_tokens": (
                round(self.cost_per_1k_tokens, 6) if self.cost_per_1k_tokens is not None else None
            ),
        }


def route_figures(
    *, rule: RoutingRule, since: datetime, until: datetime, prices: dict[str, float]
) -> RouteFigures:
    records = served_records(model=rule.model.name, since=since).filter(created_at__lt=until)
    if rule.intent:
        records = records.filter(intent=rule.intent)
    rows = list(
        records.values_list("status", "duration_ms", "node", "prompt_tokens", "completion_tokens")
    )
    errors = sum(1 for row in rows if row[0] == UsageStatus.UPSTREAM_ERROR)
    latencies = [row[1] for row in rows if row[0] == UsageStatus.OK]
    # GPU time priced per request, as if unbatched: pessimistic, but alike for every model,
    # which is what comparing them needs.
    spent = sum(prices.get(node, 0.0) * duration / 3_600_000 for _, duration, node, _, _ in rows)
    tokens = sum(prompt + completion for *_, prompt, completion in rows)
    cost = spent / (tokens / 1000) if tokens and spent else None
    return RouteFigures(
        requests=len(rows), errors=errors, latency_p95_ms=p95(latencies), cost_per_1k_tokens=cost
    )


def routing_decision_find(*, request_id: str) -> RoutingDecision | None:
    """A request's routing decision, or None when the log did not sample it (routes that
    failed are always kept, see apps.routing.decisions)."""
    return RoutingDecision.objects.filter(request_id=request_id).first()
