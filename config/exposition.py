"""/metrics: every gateway process's figures summed, closed to the public by default.

The gateway runs several processes (DMX_GATEWAY_WORKERS); each writes its counters and
histograms to files in PROMETHEUS_MULTIPROC_DIR (set by config.serve), and a scrape of any
process reads them all (prometheus_client's multiprocess mode). The fleet, stream, quota and
model-target figures, and what billing's Celery tasks found, are read from Redis and the
database at scrape time instead, the same from every process. Without the directory (a
management command, the test client) the process's own registry is served.

Access: a scrape must come from DMX_METRICS_ALLOWED_NETWORKS (loopback by default) or carry
`Authorization: Bearer DMX_METRICS_TOKEN`; anyone else gets 404, as for a page that is not there.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.registry import REGISTRY

from apps.batches.metrics import BatchCollector
from apps.billing.metrics import BillingCollector
from apps.keys.metrics import QuotaCollector
from apps.models.metrics import ModelTargetCollector
from apps.routing.metrics import FleetCollector
from dmxplatform.clients import is_trusted, trusted_networks
from dmxplatform.metrics import StreamCollector

_SCRAPE_TIME_COLLECTORS = (
    StreamCollector(),
    FleetCollector(),
    QuotaCollector(),
    ModelTargetCollector(),
    BillingCollector(),
    BatchCollector(),
)
for _collector in _SCRAPE_TIME_COLLECTORS:
    REGISTRY.register(_collector)


def _allowed(request: HttpRequest) -> bool:
    token = settings.DMX_METRICS_TOKEN
    if token:
        offered = request.headers.get("Authorization", "")
        if hmac.compare_digest(offered.encode(), f"Bearer {token}".encode()):
            return True
    return is_trusted(
        request.META.get("REMOTE_ADDR") or "",
        trusted_networks(tuple(settings.DMX_METRICS_ALLOWED_NETWORKS)),
    )


def _forget_dead_processes(directory: Path) -> None:
    """Drop the live-gauge files of gateway processes that exited: their in-flight and queued
    requests went with them (prometheus_client leaves that to the caller)."""
    for path in directory.glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, str(directory))
        except PermissionError:
            pass  # alive, someone else's


def registry() -> CollectorRegistry:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return REGISTRY
    _forget_dead_processes(Path(directory))
    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed, path=directory)
    for collector in _SCRAPE_TIME_COLLECTORS:
        summed.register(collector)
    return summed


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        raise Http404
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
