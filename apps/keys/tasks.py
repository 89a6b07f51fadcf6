from celery import shared_task
from django.conf import settings

from apps.keys.services import usage_flush, usage_prune
from dmxplatform import streams
from dmxplatform.queues import Queue


# Expires: a flush queued while no worker ran is worthless once the next one is due.
@shared_task(queue=Queue.LEDGER, time_limit=60, soft_time_limit=50, expires=30, ignore_result=True)
def usage_flush_task(shard: int | None = None) -> int:
    if streams.fan_out_shards(usage_flush_task, shard):
        return 0
    return usage_flush(shard=shard or 0)


@shared_task(queue=Queue.DEFAULT, time_limit=3600, soft_time_limit=3500, ignore_result=True)
def usage_prune_task() -> int:
    return usage_prune(older_than_days=settings.DMX_USAGE_RETENTION_DAYS)
