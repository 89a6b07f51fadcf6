from celery import shared_task

from apps.billing.services import (
    ledger_check,
    notification_deliver,
    notifications_raise,
    notifications_stranded,
)
from dmxplatform.queues import Queue


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
