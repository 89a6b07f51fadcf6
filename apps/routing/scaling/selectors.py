"""Reads for autoscaling: latency percentiles from the usage ledger, queues from the live fleet."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connections
from django.db.models import Count, QuerySet

from apps.billing.choices import UsageStatus
from apps.billing.models import UsageRecord
from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.hardware.nodestate import now as wall_clock
from apps.routing.models import ScalingPolicy
from apps.routing.scaling.slo import SLO_WINDOW, Figures
from dmxplatform.aggregates import Percentile, percentile
from dmxplatform.redis_client import sync_redis

P95 = 0.95


def _p95(rows: QuerySet[UsageRecord], field: str) -> tuple[float | None, int]:
    """Return the P95 of `field` over `rows` and how many rows there were."""
    rows = rows.filter(**{f"{field}__isnull": False})
    if connections[rows.db].vendor == "postgresql":
        result = rows.aggregate(p95=Percentile(field, fraction=P95), samples=Count("id"))
        return result["p95"], result["samples"]
    # SQLite (a laptop without PostgreSQL): a laptop's five minutes of requests fit in memory.
    values = list(rows.values_list(field, flat=True))
    return percentile(values, fraction=P95), len(values)


def _ok_requests(*, model: str, since: datetime, until: datetime) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(
        model=model, status=UsageStatus.OK, created_at__gte=since, created_at__lte=until
    )


def usage_latency_p95(*, model: str, since: datetime, until: datetime) -> tuple[float | None, int]:
    """Return the P95 end-to-end latency (ms) of the model's successful requests, and how many."""
    return _p95(_ok_requests(model=model, since=since, until=until), "duration_ms")


def usage_ttft_p95(*, model: str, since: datetime, until: datetime) -> tuple[float | None, int]:
    """Return the P95 time to first token (ms) of the model's successful streams, and how many."""
    rows = _ok_requests(model=model, since=since, until=until).filter(stream=True)
    return _p95(rows, "time_to_first_token_ms")


def fleet_queue(*, model: str) -> tuple[int, int]:
    """Return how many live nodes serve `model` and how many requests wait on them (Redis)."""
    moment = wall_clock()
    live = [
        node
        for node in map(NodeSnapshot.decode, sync_redis().hvals(fleet_key()))
        if node.model == model
        and node.is_live(now=moment, stale_after=settings.DMX_NODE_STALE_SECONDS)
    ]
    return len(live), sum(node.engine.num_requests_waiting for node in live)


def scaling_figures(*, policy: ScalingPolicy, now: datetime) -> Figures:
    """Measure a policy's model: latency over the SLO window, queue on its live nodes.

    The window starts no earlier than the last scaling change: requests served before it ran
    on another replica count, and judging them again would scale twice for the same load.
    """
    model = policy.model
    since = now - SLO_WINDOW
    if policy.last_scaled_at is not None and since < policy.last_scaled_at <= now:
        since = policy.last_scaled_at
    latency, latency_samples = usage_latency_p95(model=model.name, since=since, until=now)
    ttft, ttft_samples = (None, 0)
    if model.sla_ttft_p95_ms:
        ttft, ttft_samples = usage_ttft_p95(model=model.name, since=since, until=now)
    live_nodes, waiting = fleet_queue(model=model.name)
    return Figures(
        window_start=since,
        window_end=now,
        latency_p95_ms=latency,
        latency_samples=latency_samples,
        latency_target_ms=model.sla_latency_p95_ms,
        ttft_p95_ms=ttft,
        ttft_samples=ttft_samples,
        ttft_target_ms=model.sla_ttft_p95_ms,
        live_nodes=live_nodes,
        waiting=waiting,
        queue_target=policy.target_queue_per_node,
    )


def scaling_policy_ids_active() -> list[int]:
    return list(
        ScalingPolicy.objects.filter(is_active=True, model__is_active=True)
        .order_by("id")
        .values_list("id", flat=True)
    )


def scaling_policy_for_model(*, model_name: str) -> ScalingPolicy | None:
    """Return the active policy of the model named `model_name`, or None."""
    return (
        ScalingPolicy.objects.select_related("model")
        .filter(model__name=model_name, is_active=True)
        .first()
    )
