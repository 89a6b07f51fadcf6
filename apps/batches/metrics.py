"""Batches in /metrics, read from the database at scrape time (the batch workers are Celery
processes, outside the gateway's multiprocess files): what is open, the backlog of lines, and
lines answered and failed, whose rate is the batches' throughput."""

from __future__ import annotations

from django.db import DatabaseError
from django.db.models import Count, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from apps.batches.choices import ENDED, BatchStatus, LineState
from apps.batches.models import Batch, BatchLine
from dmxplatform.metrics import ScrapeTimeCollector

OPEN = [status for status in BatchStatus if status not in ENDED]


class BatchCollector(ScrapeTimeCollector):
    def collect(self):
        open_batches = GaugeMetricFamily(
            "dmx_batches_open", "Batches not ended, by status.", labels=["status"]
        )
        backlog = GaugeMetricFamily(
            "dmx_batch_lines_backlog",
            "Lines of open batches not yet answered: waiting or running.",
        )
        lines = CounterMetricFamily(
            "dmx_batch_lines",
            "Lines of batches that ended their run: answered (the output file) or failed "
            "(the error file).",
            labels=["outcome"],
        )
        try:
            counts, waiting, totals = _read()
        except DatabaseError:
            # Empty families rather than a failed scrape: the gateway's own figures still go.
            yield from (open_batches, backlog, lines)
            return
        for status in OPEN:
            open_batches.add_metric([status.value], counts.get(status, 0))
        backlog.add_metric([], waiting)
        for outcome in ("answered", "failed"):
            lines.add_metric([outcome], totals[outcome] or 0)
        yield from (open_batches, backlog, lines)


def _read() -> tuple[dict[str, int], int, dict[str, int | None]]:
    counts = dict(
        Batch.objects.filter(status__in=OPEN)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    waiting = BatchLine.objects.filter(
        batch__status__in=OPEN, state__in=[LineState.PENDING, LineState.RUNNING]
    ).count()
    totals = Batch.objects.aggregate(answered=Sum("completed"), failed=Sum("failed"))
    return counts, waiting, totals
