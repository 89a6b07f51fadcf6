"""Each model's targets, for Prometheus: alerts compare measured latency with these
(deploy/prometheus/rules), so a target changed in the admin moves its alert with it."""

from __future__ import annotations

from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily

from apps.models.models import LlmModel
from dmxplatform.metrics import ScrapeTimeCollector


class ModelTargetCollector(ScrapeTimeCollector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        ttft = GaugeMetricFamily(
            "dmx_model_sla_ttft_p95_seconds",
            "The model's target P95 time to first token (streams), where it has one.",
            labels=["model"],
        )
        latency = GaugeMetricFamily(
            "dmx_model_sla_latency_p95_seconds",
            "The model's target P95 end-to-end latency, where it has one.",
            labels=["model"],
        )
        try:
            targets = list(
                LlmModel.objects.filter(is_active=True).values_list(
                    "name", "sla_ttft_p95_ms", "sla_latency_p95_ms"
                )
            )
        except DatabaseError:
            targets = []  # serving goes on without the database; so does the scrape
        for name, ttft_ms, latency_ms in targets:
            if ttft_ms:
                ttft.add_metric([name], ttft_ms / 1000)
            if latency_ms:
                latency.add_metric([name], latency_ms / 1000)
        yield from (ttft, latency)
