"""The platform's own Prometheus metrics (django-prometheus adds Django's).

Names carry their units. The three-layer diagnosis of a slow request is three queries: the
gateway (dmx_gateway_stage_seconds by stage), routing (the queue and route stages,
dmx_routing_decision_seconds, dmx_gateway_queue_depth), inference (dmx_gateway_time_to_first_
token_seconds and dmx_gateway_stream_duration_seconds by model, the node gauges of
apps.routing.metrics). Every gateway process writes its own figures; /metrics sums them
(prometheus_client's multiprocess mode, config.exposition).
"""

import time

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.cluster import RedisCluster

from dmxplatform import streams
from dmxplatform.redis_client import REDIS_ERRORS, request_redis


class Bound:
    """A metric's children by label values, each bound once: `labels()` takes a lock and
    builds its key on every call, which the request path pays several times a request. For
    label values from a bounded set only (endpoints, statuses, served models, nodes, tiers)."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], object] = {}

    def __call__(self, *values: str):
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


# Buckets from 5 ms to 2 min: non-streamed completions on a GPU land between 0.1 s and 30 s.
REQUEST_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

gateway_request_duration = Histogram(
    "dmx_gateway_request_duration_seconds",
    "Time from request received to response finished, by endpoint, status and streaming.",
    ["endpoint", "status", "stream"],
    buckets=REQUEST_DURATION_BUCKETS,
)

# What a gateway stage adds: from 50 us (a cache hit) to seconds (a wait in the queue).
STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
    2.5, 5, 10, 30,
)  # fmt: skip

gateway_stage_seconds = Histogram(
    "dmx_gateway_stage_seconds",
    "Time each stage of the gateway and of routing added to a request (dmxplatform.stages).",
    ["stage"],
    buckets=STAGE_BUCKETS,
)

gateway_time_to_first_token = Histogram(
    "dmx_gateway_time_to_first_token_seconds",
    "Time from request received to the first token relayed, streamed requests, by model.",
    ["model"],
    buckets=REQUEST_DURATION_BUCKETS,
)

gateway_stream_duration = Histogram(
    "dmx_gateway_stream_duration_seconds",
    "Time from request received to the stream's end, streamed requests that finished, by model.",
    ["model"],
    buckets=REQUEST_DURATION_BUCKETS,
)

# By intent: what each kind of work waits and takes, for the operator to see which intents a
# slow fleet hurts (and whether a rule's tier holds them back as meant). Label values come from
# the classifier's fixed set of labels.
gateway_intent_time_to_first_token = Histogram(
    "dmx_gateway_intent_time_to_first_token_seconds",
    "Time from request received to the first token relayed, streamed requests that ended ok, "
    "by the intent the classifier gave them.",
    ["intent"],
    buckets=REQUEST_DURATION_BUCKETS,
)

gateway_intent_request_duration = Histogram(
    "dmx_gateway_intent_request_duration_seconds",
    "Time from request received to response finished, completion requests that ended ok, by "
    "the intent the classifier gave them.",
    ["intent"],
    buckets=REQUEST_DURATION_BUCKETS,
)

routing_decision_seconds = Histogram(
    "dmx_routing_decision_seconds",
    "Time one routing decision took (filters and scores over the model's nodes).",
    buckets=(0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01),
)

gateway_upstream_errors = Counter(
    "dmx_gateway_upstream_errors_total",
    "Failed calls to nodes, by what failed: the node's HTTP status, `connect` (no connection) or "
    "`stream` (an error event or an early end mid-stream).",
    ["code"],
)

gateway_queue_depth = Gauge(
    "dmx_gateway_queue_depth",
    "Requests waiting in the priority queue of a saturated model, all gateway processes.",
    ["model"],
    multiprocess_mode="livesum",
)

gateway_node_inflight = Gauge(
    "dmx_node_gateway_inflight_requests",
    "Requests the gateway processes have in flight on the node.",
    ["node"],
    multiprocess_mode="livesum",
)

gateway_tokens = Counter(
    "dmx_gateway_tokens_total",
    "Tokens served through the gateway, by model, kind (prompt or completion) and key tier.",
    ["model", "kind", "tier"],
)

gateway_refusals = Counter(
    "dmx_gateway_admissions_refused_total",
    "Requests refused before reaching a node, by reason: a key limit's meter (requests, tokens, "
    "concurrency, quota, nonce), `large_body` (the off-loop capacity), `queue_timeout` (no room "
    "freed in time) or `no_capacity` (no live node).",
    ["reason"],
)
gateway_connections_closed = Counter(
    "dmx_gateway_connections_closed_total",
    "Client connections the gateway closed itself, by reason: `idle` (keep-alive expired with "
    "nothing waiting in it) or `unanswered` (a request ended without a complete response while "
    "its client was still there; logged with its request id).",
    ["reason"],
)

gateway_keepalive_requests_waiting = Counter(
    "dmx_gateway_keepalive_requests_waiting_total",
    "Idle connections whose keep-alive expired with a request already sent in them (the process "
    "was stalled): kept open to answer it, where uvicorn alone would reset it.",
)
# Present from the start, so that rate() and alerts see the first one (the refusal reasons are
# where they are counted: apps.keys.admission, apps.routing.dispatcher, apps.gateway.runtime).
for _code in ("connect", "stream"):
    gateway_upstream_errors.labels(_code)
for _reason in ("idle", "unanswered"):
    gateway_connections_closed.labels(_reason)

gateway_intents = Counter(
    "dmx_gateway_intents_total",
    "Completion requests by the intent the classifier gave them and whether its confidence was "
    "below DMX_INTENT_MIN_CONFIDENCE (`low`: routed by the alias's default route), for drift.",
    ["intent", "confidence"],
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


class ScrapeTimeCollector(Collector):
    """A collector that reads Redis or the database when scraped. It describes nothing, so
    that registering it reads nothing: the registry would otherwise collect once to learn its
    names, at import, maybe inside an event loop where the database may not be used."""

    def describe(self) -> list:
        return []


class StreamCollector(ScrapeTimeCollector):
    """Each durable stream's backlog and parked entries, read from Redis at scrape time: a
    backlog that only grows is a ledger that stopped (alert on it), parked entries need a
    person."""

    def collect(self):
        backlog = GaugeMetricFamily(
            "dmx_stream_backlog_entries",
            "Entries waiting in a durable stream to be stored in the database.",
            labels=["stream", "shard"],
        )
        oldest = GaugeMetricFamily(
            "dmx_stream_oldest_entry_age_seconds",
            "Age of the oldest entry waiting in a durable stream (0 when it is empty).",
            labels=["stream", "shard"],
        )
        dead = GaugeMetricFamily(
            "dmx_stream_parked_entries",
            "Entries that could never be stored, parked in a stream's dead-letter stream.",
            labels=["stream", "shard"],
        )
        client = request_redis()
        # A shard's three figures come in one round trip; on a cluster, each shard's own (its
        # streams share a slot), so a master away costs the figures of its shards only. On a
        # single Redis one failure means all of it is away: no point paying a timeout per shard.
        on_cluster = isinstance(client, RedisCluster)
        now_ms = time.time() * 1000
        for stream in streams.every_shard():
            try:
                pipe = client.pipeline(transaction=False)
                pipe.xlen(stream.key())
                pipe.xrange(stream.key(), count=1)
                pipe.xlen(stream.dead_letter_key())
                length, first, parked_count = pipe.execute()
            except REDIS_ERRORS:
                # No figures rather than a failed scrape; Redis has its own alerts.
                if on_cluster:
                    continue
                break
            labels = [stream.stream.label, str(stream.number)]
            backlog.add_metric(labels, length)
            first_ms = int(first[0][0].split(b"-")[0]) if first else now_ms
            oldest.add_metric(labels, max(now_ms - first_ms, 0) / 1000)
            dead.add_metric(labels, parked_count)
        yield from (backlog, oldest, dead)
