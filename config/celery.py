"""The Celery app: tasks live in each app's tasks.py and are found automatically; each task
names its queue (dmxplatform.queues)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")

app = Celery("dmxplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Scaling keeps its tasks beside its scalers, one level below the routing app.
app.autodiscover_tasks(["apps.routing.scaling"])
