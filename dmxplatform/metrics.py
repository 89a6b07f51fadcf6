"""The platform's own Prometheus metrics (django-prometheus adds Django's)."""

import time

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from redis.exceptions import RedisError

from dmxplatform import streams
from dmxplatform.redis_client import sync_redis

# Buckets from 5 ms to 2 min: non-streamed completions on a GPU land between 0.1 s and 30 s.
REQUEST_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

gateway_request_duration = Histogram(
    "dmx_gateway_request_duration_seconds",
    "Time from request received to response finished, by endpoint, status and streaming.",
    ["endpoint", "status", "stream"],
    buckets=REQUEST_DURATION_BUCKETS,
)

gateway_tokens = Counter(
    "dmx_gateway_tokens_total",
    "Tokens served through the gateway, by model and kind (prompt or completion).",
    ["model", "kind"],
)

node_heartbeats = Counter(
    "dmx_node_heartbeats_total",
    "Node heartbeats this process answered, by HTTP status (401: a bad or revoked token).",
    ["status"],
)

gateway_admissions = Counter(
    "dmx_gateway_admissions_total",
    "Requests admitted against their key's limits, by how: from this process's lease or by a "
    "Redis round trip (keys without limits are not counted).",
    ["via"],
)


class StreamCollector(Collector):
    """Each durable stream's backlog and parked entries, read from Redis at scrape time: a
    backlog that only grows is a ledger that stopped (alert on it), parked entries need a
    person."""

    def collect(self):
        backlog = GaugeMetricFamily(
            "dmx_stream_backlog_entries",
            "Entries waiting in a durable stream to be stored in the database.",
            labels=["stream"],
        )
        oldest = GaugeMetricFamily(
            "dmx_stream_oldest_entry_age_seconds",
            "Age of the oldest entry waiting in a durable stream (0 when it is empty).",
            labels=["stream"],
        )
        dead = GaugeMetricFamily(
            "dmx_stream_parked_entries",
            "Entries that could never be stored, parked in a stream's dead-letter stream.",
            labels=["stream"],
        )
        durable = list(streams.REGISTRY.values())
        try:
            pipe = sync_redis().pipeline(transaction=False)
            for stream in durable:
                pipe.xlen(stream.key())
                pipe.xrange(stream.key(), count=1)
                pipe.xlen(stream.dead_letter_key())
            replies = pipe.execute()
        except RedisError:
            return  # no figures rather than a failed scrape; Redis has its own alerts
        now_ms = time.time() * 1000
        for index, stream in enumerate(durable):
            length, first, parked_count = replies[3 * index : 3 * index + 3]
            backlog.add_metric([stream.label], length)
            first_ms = int(first[0][0].split(b"-")[0]) if first else now_ms
            oldest.add_metric([stream.label], max(now_ms - first_ms, 0) / 1000)
            dead.add_metric([stream.label], parked_count)
        yield from (backlog, oldest, dead)


REGISTRY.register(StreamCollector())
