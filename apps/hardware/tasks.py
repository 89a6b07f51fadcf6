from celery import shared_task

from apps.hardware.services import nodes_sync
from dmxplatform.queues import Queue


@shared_task(queue=Queue.FLEET, time_limit=30, soft_time_limit=20, expires=10, ignore_result=True)
def nodes_sync_task() -> int:
    return nodes_sync()
