from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from apps.billing.choices import UsageStatus
from apps.billing.models import UsageRecord
from apps.hardware.nodestate import NodeSnapshot, fleet_key, now
from apps.models.models import LlmModel
from apps.routing.choices import ScalerBackend
from apps.routing.models import ScalingPolicy
from dmxplatform.redis_client import sync_redis
from inference.wire import EngineLoad
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.routing.factories import with_engine

NAMESPACE = "inference"


def make_policy(
    model_name: str,
    *,
    latency_target_ms: int | None = None,
    ttft_target_ms: int | None = None,
    **fields,
) -> ScalingPolicy:
    """A policy for a new model; Kubernetes backend on deployment `model_name` unless told."""
    model, _ = make_model(model_name)
    LlmModel.objects.filter(pk=model.pk).update(
        sla_latency_p95_ms=latency_target_ms, sla_ttft_p95_ms=ttft_target_ms
    )
    model.refresh_from_db()
    fields.setdefault("backend", ScalerBackend.KUBERNETES)
    if fields["backend"] == ScalerBackend.KUBERNETES:
        fields.setdefault("kubernetes_namespace", NAMESPACE)
        fields.setdefault("kubernetes_deployment", model_name)
    policy = ScalingPolicy(model=model, **fields)
    policy.full_clean()
    policy.save()
    return policy


def record_requests(
    model: str,
    durations_ms: Iterable[float],
    *,
    at: datetime,
    status: str = UsageStatus.OK,
    stream: bool = False,
    ttfts_ms: Iterable[float | None] | None = None,
) -> list[UsageRecord]:
    """Write finished requests into the usage ledger, as the ledger flush would."""
    key, _ = make_api_key()
    durations = list(durations_ms)
    ttfts = list(ttfts_ms) if ttfts_ms is not None else [None] * len(durations)
    return UsageRecord.objects.bulk_create(
        UsageRecord(
            request_id=f"req-{uuid.uuid4().hex}",
            api_key=key,
            tenant_id=key.tenant_id,
            created_at=at,
            endpoint="chat.completions",
            model=model,
            stream=stream,
            status=status,
            http_status=200 if status == UsageStatus.OK else 502,
            duration_ms=duration,
            time_to_first_token_ms=ttft,
        )
        for duration, ttft in zip(durations, ttfts, strict=True)
    )


_node_ids = iter(range(900_000, 10**9))


def publish_node(
    model: str, *, waiting: int, status: str = "up", age_seconds: float = 0.0
) -> NodeSnapshot:
    """Put a node into the Redis fleet hash, as a heartbeat would."""
    node_id = next(_node_ids)
    snapshot = NodeSnapshot(
        id=node_id,
        name=f"node-{node_id}",
        url=f"http://127.0.0.1:{node_id % 60000}",
        status=status,
        model=model,
        version_id=1,
        version_tag="v1",
        served_model_name=model,
        max_model_len=2048,
        heartbeat_at=now() - age_seconds,
        engine=EngineLoad(num_requests_waiting=waiting),
    )
    sync_redis().hset(fleet_key(), str(node_id), snapshot.encode())
    return snapshot


def update_node(snapshot: NodeSnapshot, **changes) -> NodeSnapshot:
    """Change a node in the fleet hash, as its next heartbeat would (fresh unless told)."""
    changes.setdefault("heartbeat_at", now())
    snapshot = with_engine(snapshot, **changes)
    sync_redis().hset(fleet_key(), str(snapshot.id), snapshot.encode())
    return snapshot
