from celery import shared_task
from django.conf import settings

from apps.models.models import ModelVersion
from apps.routing.services import (
    canary_evaluate,
    decisions_flush,
    decisions_prune,
    weights_recompute,
    work_profiles_recompute,
)
from dmxplatform import streams
from dmxplatform.queues import Queue


@shared_task(queue=Queue.LEDGER, time_limit=60, soft_time_limit=50, expires=30, ignore_result=True)
def decisions_flush_task(shard: int | None = None) -> int:
    return streams.drain_task(decisions_flush_task, decisions_flush, shard)


@shared_task(queue=Queue.DEFAULT, time_limit=3600, soft_time_limit=3500, ignore_result=True)
def decisions_prune_task() -> int:
    return decisions_prune(older_than_days=settings.DMX_DECISION_LOG_RETENTION_DAYS)


@shared_task(queue=Queue.DEFAULT, time_limit=60, soft_time_limit=50, ignore_result=True)
def canary_evaluate_task(version_id: int) -> str | None:
    event = canary_evaluate(version_id=version_id)
    return event.action if event else None


@shared_task(queue=Queue.DEFAULT, time_limit=30, soft_time_limit=20, expires=50, ignore_result=True)
def canaries_evaluate_task() -> int:
    """Fan out: one evaluation per canary, so a slow one does not hold the others."""
    ids = list(
        ModelVersion.objects.filter(is_stable=False, canary_percent__gt=0).values_list(
            "id", flat=True
        )
    )
    for version_id in ids:
        canary_evaluate_task.delay(version_id)
    return len(ids)


@shared_task(queue=Queue.DEFAULT, time_limit=1800, soft_time_limit=1700, ignore_result=True)
def weights_recompute_task() -> int:
    return weights_recompute().id


@shared_task(
    queue=Queue.DEFAULT, time_limit=300, soft_time_limit=280, expires=60, ignore_result=True
)
def work_profiles_recompute_task() -> int:
    return work_profiles_recompute()
