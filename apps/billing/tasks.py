from celery import shared_task
from django.conf import settings

from apps.billing.services import (
    ledger_check,
    notification_deliver,
    notifications_raise,
    notifications_stranded,
    usage_flush,
    usage_prune,
)
from dmxplatform import streams
from dmxplatform.queues import Queue


# Expires: a flush queued while no worker ran is worthless once the next one is due.
@shared_task(queue=Queue.LEDGER, time_limit=60, soft_time_limit=50, expires=30, ignore_result=True)
def usage_flush_task(shard: int | None = None) -> int:
    return streams.drain_task(usage_flush_task, usage_flush, shard)


@shared_task(queue=Queue.DEFAULT, time_limit=3600, soft_time_limit=3500, ignore_result=True)
def usage_prune_task() -> int:
    return usage_prune(older_than_days=settings.DMX_USAGE_RETENTION_DAYS)


# Expires: a run queued while no worker ran is worthless once the next one is due.
@shared_task(
    queue=Queue.DEFAULT, time_limit=120, soft_time_limit=110, expires=30, ignore_result=True
)
def billing_alerts_task() -> int:
    """Record budget and balance alerts not sent this period, and deliver them."""
    due = notifications_raise() + notifications_stranded()
    for notification_id in due:
        billing_notification_deliver_task.delay(notification_id)
    return len(due)


# Each run mails (EMAIL_TIMEOUT) and posts (WEBHOOK_TIMEOUT_SECONDS) at most once; retries are
# counted on the notification (DMX_WEBHOOK_ATTEMPTS), not by Celery.
@shared_task(
    bind=True,
    queue=Queue.DEFAULT,
    time_limit=60,
    soft_time_limit=50,
    max_retries=None,
    ignore_result=True,
)
def billing_notification_deliver_task(self, notification_id: int) -> bool:
    """Mail and post one notification; again after a back-off while either fails."""
    delivery = notification_deliver(notification_id=notification_id)
    if delivery.retry_in is not None:
        raise self.retry(countdown=delivery.retry_in)
    return delivery.delivered


# Sums every account's movements: bounded below the schedule's 5 minutes, so two never overlap.
@shared_task(
    queue=Queue.DEFAULT, time_limit=280, soft_time_limit=270, expires=300, ignore_result=True
)
def billing_ledger_check_task() -> int:
    """Compare every prepaid balance with the sum of its movements (the gauge the alert reads)."""
    return len(ledger_check())
