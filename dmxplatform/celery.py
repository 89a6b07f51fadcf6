"""The Celery app: tasks live in each app's tasks.py and are found automatically."""

import os
from enum import StrEnum

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")


class Queue(StrEnum):
    """Queues by latency need: ledger and fleet work must not wait behind nightly jobs."""

    DEFAULT = "default"
    LEDGER = "ledger"
    FLEET = "fleet"


app = Celery("dmxplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Scaling keeps its tasks beside its scalers, one level below the routing app.
app.autodiscover_tasks(["apps.routing.scaling"])
