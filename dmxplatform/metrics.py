"""The platform's own Prometheus metrics (django-prometheus adds Django's)."""

from prometheus_client import Counter, Histogram

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
