"""The OpenAI-compatible gateway: keys, upstream timeouts, in-process state refresh."""

from dmxplatform.env import env_float, env_int, env_list
from dmxplatform.settings.base import secret_from_env

# HMAC key for API-key secrets: the database holds HMAC(pepper, secret), never the secret. As
# with SECRET_KEY, a development pepper only when DEBUG is on; production must set its own.
DMX_KEY_PEPPER = secret_from_env("DMX_KEY_PEPPER", "dev-pepper-change-me")

# How often each gateway process reloads fleet state and checks the catalog version, seconds.
DMX_STATE_REFRESH_SECONDS = env_float("DMX_STATE_REFRESH_SECONDS", 0.5, minimum=0.05)
# An authenticated key is re-read from Redis at least this often even without invalidation.
DMX_KEY_CACHE_TTL_SECONDS = env_float("DMX_KEY_CACHE_TTL_SECONDS", 60.0, minimum=0.0)

# Upstream (vLLM node) timeouts, seconds. Connecting is quick on a healthy node; the read timeout
# bounds the gap between two chunks, so a long generation is not cut off.
DMX_UPSTREAM_CONNECT_TIMEOUT = env_float("DMX_UPSTREAM_CONNECT_TIMEOUT", 2.0, minimum=0.1)
DMX_UPSTREAM_READ_TIMEOUT = env_float("DMX_UPSTREAM_READ_TIMEOUT", 120.0, minimum=1.0)
# Idle keep-alive connections kept per node; enough for a burst without reconnecting.
DMX_UPSTREAM_POOL_PER_NODE = env_int("DMX_UPSTREAM_POOL_PER_NODE", 256, minimum=1)
# Redis calls on the request path give up after this long, seconds.
DMX_REDIS_TIMEOUT = env_float("DMX_REDIS_TIMEOUT", 1.0, minimum=0.05)
# A completion request with a larger body is parsed, screened and counted in a worker thread
# instead of on the event loop (the content filter takes about 0.1 ms per KB), bytes.
DMX_LARGE_BODY_BYTES = env_int("DMX_LARGE_BODY_BYTES", 32 * 1024, minimum=0)
# Large requests that may wait for that thread, per gateway process (more get 503), and of them
# one key's (more get 429): a client's megabytes must not queue everyone else's behind them.
DMX_LARGE_BODY_QUEUE = env_int("DMX_LARGE_BODY_QUEUE", 8, minimum=1)
DMX_LARGE_BODY_PER_KEY = env_int("DMX_LARGE_BODY_PER_KEY", 2, minimum=1)
# A request body (a prompt, a heartbeat) must arrive within this, seconds: 8 MiB at 4 Mbit/s.
DMX_BODY_READ_TIMEOUT_SECONDS = env_float("DMX_BODY_READ_TIMEOUT_SECONDS", 20.0, minimum=0.1)
# A completion request, streamed or not, ends after this long, seconds (OpenAI's client gives up
# after 600 s too); a stream cut off here ends with an error event and is billed what it made.
DMX_REQUEST_TIMEOUT_SECONDS = env_float("DMX_REQUEST_TIMEOUT_SECONDS", 600.0, minimum=1.0)
# A gateway told to stop waits for its requests this much longer than the longest may take.
DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS = env_float(
    "DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS", 30.0, minimum=0.0
)
# An idle client connection is closed after this, seconds. Longer than any pool in front of the
# gateway keeps one idle (load balancers: 60 s; httpx and OpenAI's SDK: 5 s, as uvicorn's own
# default, so a request sent at the last moment met a closing socket): the side that gives up
# on a connection must be the one that sends on it. 75 s is nginx's default for the same reason.
DMX_GATEWAY_KEEPALIVE_SECONDS = env_int("DMX_GATEWAY_KEEPALIVE_SECONDS", 75, minimum=1)
# An intent label the classifier gives with less confidence than this (its calibrated
# probability, 0-1) routes by the alias's default route instead: below 0.5, 52 of 115 labels were
# wrong on the generator's held-out split (13% above it); on the realistic set (tools/intent/data/
# realistic.jsonl) 6 of 504 fall below it (python -m tools.intent report; README, Intent).
DMX_INTENT_MIN_CONFIDENCE = env_float("DMX_INTENT_MIN_CONFIDENCE", 0.5, minimum=0.0)
# Retry-After sent with 503 when no node can serve, seconds.
DMX_RETRY_AFTER_SECONDS = env_int("DMX_RETRY_AFTER_SECONDS", 2, minimum=1)

# Completion tokens reserved against limits when a request sets no max_tokens; settling
# corrects the reservation to what was really generated.
DMX_DEFAULT_COMPLETION_RESERVE = env_int("DMX_DEFAULT_COMPLETION_RESERVE", 256, minimum=1)
# Admission leases (apps/keys/leases.py): a gateway process admits a busy key's requests from a
# share of its limits taken this many requests at a time, kept at most DMX_ADMISSION_LEASE_MS;
# 0 sends every admission to Redis.
DMX_ADMISSION_LEASE_REQUESTS = env_int("DMX_ADMISSION_LEASE_REQUESTS", 16, minimum=0)
DMX_ADMISSION_LEASE_MS = env_int("DMX_ADMISSION_LEASE_MS", 1000, minimum=10)
# When the nodes serving a model use more than this fraction of their KV cache on average,
# prompts are held to DMX_CONTEXT_PRESSURE_FACTOR of the model's context.
DMX_CONTEXT_WATERMARK = env_float("DMX_CONTEXT_WATERMARK", 0.9, minimum=0.0)
DMX_CONTEXT_PRESSURE_FACTOR = env_float("DMX_CONTEXT_PRESSURE_FACTOR", 0.5, minimum=0.01)
# Proxies whose X-Forwarded-For is believed (CIDRs): for a key's allowed networks, and for the
# address the audit log records (dmxplatform/audit/middleware.py).
DMX_TRUSTED_PROXIES = env_list("DMX_TRUSTED_PROXIES", [])

# Stored responses (/v1/responses with `store`, OpenAI's default): kept this many days, then
# purged nightly, as OpenAI keeps them 30.
DMX_RESPONSES_RETENTION_DAYS = env_int("DMX_RESPONSES_RETENTION_DAYS", 30, minimum=1)
# A stored response is also kept this long in Redis, seconds: the next turn of a conversation
# (previous_response_id) and polls of a background run read it there, not from PostgreSQL,
# which gets it through a durable stream a second or two later.
DMX_RESPONSES_HOT_SECONDS = env_int("DMX_RESPONSES_HOT_SECONDS", 3600, minimum=60)
# How often a background response checks whether it was cancelled, seconds: the longest it
# generates (and is billed for) after POST /v1/responses/{id}/cancel.
DMX_BACKGROUND_CANCEL_POLL_SECONDS = env_float(
    "DMX_BACKGROUND_CANCEL_POLL_SECONDS", 0.5, minimum=0.05
)
