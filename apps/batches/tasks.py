from celery import shared_task
from django.conf import settings

from apps.batches import services
from apps.batches.work import work_once
from dmxplatform.queues import Queue


# Every tick, and once at each batch's creation. Expires: a tick queued while the workers were
# busy is worthless once the next is due. The time limit leaves a turn its slice and its lines'
# longest answers.
@shared_task(
    queue=Queue.BATCHES,
    expires=settings.DMX_BATCH_TICK_SECONDS,
    time_limit=settings.DMX_BATCH_SLICE_SECONDS + 900,
    ignore_result=True,
)
def batches_work_task() -> bool:
    """Take one batch no worker holds and work on it for a turn; after a turn, go again at
    once rather than at the next tick (a batch left holds no one up: the next turn finds it)."""
    worked = work_once()
    if worked:
        batches_work_task.delay()
    return worked


@shared_task(queue=Queue.DEFAULT, time_limit=3600, soft_time_limit=3500, ignore_result=True)
def batch_files_purge_task() -> int:
    return services.files_purge()
