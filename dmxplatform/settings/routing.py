"""The router: filter thresholds, scorer weights, breakers, canaries, the decision log."""

import json

from django.core.exceptions import ImproperlyConfigured

from dmxplatform.env import env_bool, env_float, env_int, env_optional

# Nodes hotter than this get no traffic (most datacenter GPUs throttle from about 85 C).
DMX_ROUTE_DRAIN_TEMPERATURE_C = env_float("DMX_ROUTE_DRAIN_TEMPERATURE_C", 85.0)
# ...and are derated from this temperature up.
DMX_ROUTE_DERATE_TEMPERATURE_C = env_float("DMX_ROUTE_DERATE_TEMPERATURE_C", 78.0)
# A node whose KV cache is fuller than this gets no new request: it would preempt others.
DMX_ROUTE_KV_CACHE_LIMIT = env_float("DMX_ROUTE_KV_CACHE_LIMIT", 0.97, minimum=0.0)
# A node with more requests than this queued (its engine's waiting ones plus this gateway's in
# flight beyond the engine's --max-num-seqs) is saturated; when every node is, requests wait in
# the priority queue.
DMX_ROUTE_SATURATION_QUEUE = env_int("DMX_ROUTE_SATURATION_QUEUE", 16, minimum=1)
# Memory-bandwidth use above which a node is derated: decode is bandwidth-bound, so a node at
# 92% is a bottleneck even with free memory.
DMX_ROUTE_BANDWIDTH_KNEE = env_float("DMX_ROUTE_BANDWIDTH_KNEE", 0.7, minimum=0.0)
# The hours of usage the router's work figures cover (apps.routing.work): a day holds every
# hour's mix of traffic, and a change of clients shows within it.
DMX_WORK_PROFILES_WINDOW_HOURS = env_float("DMX_WORK_PROFILES_WINDOW_HOURS", 24.0, minimum=0.1)
# Characters of the prompt's start that make its affinity key (a system prompt, usually).
DMX_ROUTE_AFFINITY_PREFIX_CHARS = env_int("DMX_ROUTE_AFFINITY_PREFIX_CHARS", 512, minimum=16)

DEFAULT_SCORE_WEIGHTS = {
    "queue": 3.0,
    "kv_cache": 1.0,
    "bandwidth": 1.0,
    "temperature": 1.0,
    "latency": 1.0,
    "cost": 0.5,
    "affinity": 2.0,
    "hardware": 1.0,
}
_weights = env_optional("DMX_ROUTE_SCORE_WEIGHTS")
try:
    DMX_ROUTE_SCORE_WEIGHTS = {
        **DEFAULT_SCORE_WEIGHTS,
        **(json.loads(_weights) if _weights else {}),
    }
except ValueError as exc:
    raise ImproperlyConfigured(f"DMX_ROUTE_SCORE_WEIGHTS must be a JSON object: {exc}") from exc

# Priority queue when a model is saturated: at most this many waiting per model and process,
# each at most this long before it gets 503 with Retry-After.
DMX_ADMISSION_QUEUE_MAX = env_int("DMX_ADMISSION_QUEUE_MAX", 256, minimum=0)
DMX_ADMISSION_TIMEOUT_SECONDS = env_float("DMX_ADMISSION_TIMEOUT_SECONDS", 10.0, minimum=0.0)

# Circuit breakers: this many consecutive failures open one; it stays open this long, then
# lets one probe through.
DMX_BREAKER_FAILURES = env_int("DMX_BREAKER_FAILURES", 3, minimum=1)
DMX_BREAKER_COOLDOWN_SECONDS = env_float("DMX_BREAKER_COOLDOWN_SECONDS", 10.0, minimum=0.1)
# A first token slower than this many times its model's P95 target (or than the seconds below,
# for a model without a target) counts as a failure, when the node had nothing else to do and
# another healthy node serves the model (apps.routing.breaker.slow_first_token).
DMX_BREAKER_SLOW_SLA_FACTOR = env_float("DMX_BREAKER_SLOW_SLA_FACTOR", 4.0, minimum=1.0)
DMX_BREAKER_SLOW_TTFT_SECONDS = env_float("DMX_BREAKER_SLOW_TTFT_SECONDS", 2.0, minimum=0.01)
# ...for prompts up to this many tokens: a longer one's prefill is slow on any node.
DMX_BREAKER_SLOW_PROMPT_TOKENS = env_int("DMX_BREAKER_SLOW_PROMPT_TOKENS", 4096, minimum=1)

# Canaries are judged after this many requests since they started.
DMX_CANARY_MIN_REQUESTS = env_int("DMX_CANARY_MIN_REQUESTS", 100, minimum=1)
# ...and rolled back when their error rate exceeds the stable version's by more than this.
DMX_CANARY_ERROR_TOLERANCE = env_float("DMX_CANARY_ERROR_TOLERANCE", 0.01, minimum=0.0)

# Routing decisions logged per second per gateway process; above it, a share is sampled.
DMX_DECISION_LOG_PER_SECOND = env_float("DMX_DECISION_LOG_PER_SECOND", 20.0, minimum=0.0)
DMX_DECISION_LOG_RETENTION_DAYS = env_int("DMX_DECISION_LOG_RETENTION_DAYS", 14, minimum=1)

# Nightly weight recomputation: applied at once, or kept for an operator to approve.
DMX_ROUTING_WEIGHTS_AUTO_APPLY = env_bool("DMX_ROUTING_WEIGHTS_AUTO_APPLY", False)
