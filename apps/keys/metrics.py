"""Quotas near exhaustion, for Prometheus: read at scrape time from the quota counters.

Only quotas past DMX_METRICS_QUOTA_MIN_RATIO of their limit are exported, so that the series
stay as few as the tenants who may soon be refused, however many keys there are.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily

from apps.keys.selectors import quota_status_all
from dmxplatform.metrics import ScrapeTimeCollector
from dmxplatform.redis_client import REDIS_ERRORS


class QuotaCollector(ScrapeTimeCollector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "dmx_quota_used_ratio",
            "Share of a token quota used this period (reservations in flight included), for "
            "quotas past DMX_METRICS_QUOTA_MIN_RATIO; key is the key's public id, empty for "
            "the tenant's plan quota.",
            labels=["tenant", "key", "period", "model"],
        )
        try:
            quotas = quota_status_all()
        except (DatabaseError, *REDIS_ERRORS):
            quotas = []  # an empty family rather than a failed scrape
        floor = settings.DMX_METRICS_QUOTA_MIN_RATIO
        for tenant, quota in quotas:
            ratio = quota.used / quota.limit if quota.limit else 1.0
            if ratio >= floor:
                family.add_metric([tenant, quota.key_id, quota.period, quota.model], ratio)
        yield family
