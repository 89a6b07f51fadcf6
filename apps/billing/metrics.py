"""Billing's own series: money spent (counted by the gateways as they settle), balance
movements, and the ledger check's findings, which an alert rule watches.

Prometheus scrapes the gateways only (deploy/prometheus/prometheus.yml), while the ledger check
and the usage flush that counts a shortfall run in Celery workers: what they find is kept in
the coordination Redis and read back at scrape time (BillingCollector, registered by
config.exposition), the same from every gateway process and replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dmxplatform.metrics import ScrapeTimeCollector
from dmxplatform.redis_client import REDIS_ERRORS, rkey, sync_redis

logger = logging.getLogger(__name__)

spend = Counter(
    "dmx_spend_total",
    "Money requests cost at settle, in DMX_CURRENCY, by model and the tenant's plan (the book "
    "of record is PostgreSQL's usage records; this is for dashboards and alerts).",
    ["model", "plan"],
)
balance_movements = Counter(
    "dmx_balance_movements_total", "Prepaid balance movements recorded, by kind.", ["kind"]
)


def _ledger_key() -> str:
    return rkey("billing", "ledger-check")


def _shortfall_key() -> str:
    return rkey("billing", "shortfall")


class _LedgerMismatches:
    """The ledger check's finding, for every gateway's /metrics to export."""

    def set(self, value: int) -> None:
        try:
            sync_redis().hset(
                _ledger_key(), mapping={"mismatches": value, "checked_at": time.time()}
            )
        except REDIS_ERRORS:
            # The check's own log names the accounts; DmxBalanceLedgerCheckStale notices.
            logger.warning("the ledger check's finding (%s) could not be kept in Redis", value)


class _Shortfall:
    """Money charged beyond a balance, summed over every process that charges."""

    def inc(self, amount: float = 1.0) -> None:
        try:
            sync_redis().incrbyfloat(_shortfall_key(), amount)
        except REDIS_ERRORS:
            # Never fail the flush that charges over a figure; the shortfall is logged there.
            logger.warning("a balance shortfall of %s could not be counted in Redis", amount)


balance_shortfall = _Shortfall()
ledger_mismatches = _LedgerMismatches()


class BillingCollector(ScrapeTimeCollector):
    """The ledger check's finding and the shortfall total, read from Redis at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        mismatches = GaugeMetricFamily(
            "dmx_balance_ledger_mismatches",
            "Accounts whose balance differs from the sum of their movements, at the last check.",
        )
        checked = GaugeMetricFamily(
            "dmx_balance_ledger_checked_timestamp_seconds",
            "When the balance ledger check last ran (Unix time).",
        )
        shortfall = CounterMetricFamily(
            "dmx_balance_shortfall",
            "Money a prepaid request cost beyond the balance left to charge it to, in "
            "DMX_CURRENCY (should stay 0).",
        )
        try:
            pipe = sync_redis().pipeline(transaction=False)
            pipe.hmget(_ledger_key(), "mismatches", "checked_at")
            pipe.get(_shortfall_key())
            (found, at), short = pipe.execute()
        except REDIS_ERRORS:
            # Empty families rather than a failed scrape; no shortfall sample either, which a
            # 0 would be read as a counter reset and the next scrape as a jump.
            yield from (mismatches, checked, shortfall)
            return
        if found is not None:
            mismatches.add_metric([], float(found))
        if at is not None:
            checked.add_metric([], float(at))
        shortfall.add_metric([], float(short or 0))
        yield from (mismatches, checked, shortfall)
