"""The composition root: what wires the apps into one platform (the ASGI and Celery entry
points, the URL maps, the metrics exposition, the server launcher, the admin site, the demo
set-up). The kernel (dmxplatform) and the apps never import it."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
