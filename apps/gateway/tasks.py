"""The gateway's Celery tasks: stored responses into PostgreSQL, and out after their retention."""

from __future__ import annotations

from celery import shared_task

from apps.gateway.services import stored_responses_flush, stored_responses_purge
from dmxplatform import streams
from dmxplatform.queues import Queue


# Expires: a flush queued while no worker ran is worthless once the next one is due.
@shared_task(queue=Queue.LEDGER, time_limit=60, soft_time_limit=50, expires=30, ignore_result=True)
def stored_responses_flush_task(shard: int | None = None) -> int:
    return streams.drain_task(stored_responses_flush_task, stored_responses_flush, shard)


@shared_task(queue=Queue.DEFAULT, time_limit=3600, soft_time_limit=3500, ignore_result=True)
def stored_responses_purge_task() -> int:
    return stored_responses_purge()
