"""Observability: /metrics, tracing and the console's links to it.

Each concern adds its settings here, grouped under a comment.
"""

from django.core.exceptions import ImproperlyConfigured

from dmxplatform.env import env_float, env_list, env_optional, env_str

# /metrics ------------------------------------------------------------------------------------
# Who may scrape: these networks, or anyone with `Authorization: Bearer DMX_METRICS_TOKEN`.
# Loopback only by default: the figures name every node, model and key tier.
DMX_METRICS_ALLOWED_NETWORKS = env_list("DMX_METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"])
DMX_METRICS_TOKEN = env_optional("DMX_METRICS_TOKEN")
# Quotas past this share of their limit are exported (dmx_quota_used_ratio); below it, none.
DMX_METRICS_QUOTA_MIN_RATIO = env_float("DMX_METRICS_QUOTA_MIN_RATIO", 0.5, minimum=0.0)

# The request trace's link to a request's spans -----------------------------------------------
# (the engine's own among them: vLLM exports its spans over OTLP to the same backend)
# A tracing UI's page for one trace, e.g. http://jaeger:16686/trace/{trace_id}; empty: no link.
DMX_TRACE_URL = env_str("DMX_TRACE_URL", "")
if DMX_TRACE_URL and "{trace_id}" not in DMX_TRACE_URL:
    raise ImproperlyConfigured("DMX_TRACE_URL must contain {trace_id}")

# Tracing (OpenTelemetry) -----------------------------------------------------------------------
# Off unless an OTLP/HTTP collector is named (its base URL, e.g. http://collector:4318; spans go
# to /v1/traces). On: a span per request with one per gateway stage and one per upstream call,
# and W3C traceparent to vLLM, whose spans join the request's trace. Needs the `tracing` extra.
DMX_OTLP_ENDPOINT = env_optional("DMX_OTLP_ENDPOINT")
DMX_OTEL_SERVICE_NAME = env_str("DMX_OTEL_SERVICE_NAME", "dmx-gateway")
# The share of requests traced (the rest send an unsampled traceparent: vLLM skips them too).
DMX_OTEL_SAMPLE_RATIO = env_float("DMX_OTEL_SAMPLE_RATIO", 1.0, minimum=0.0)
if DMX_OTEL_SAMPLE_RATIO > 1:
    raise ImproperlyConfigured(f"DMX_OTEL_SAMPLE_RATIO must be <= 1, got {DMX_OTEL_SAMPLE_RATIO}")
if DMX_OTLP_ENDPOINT:
    from importlib.util import find_spec

    if not (find_spec("opentelemetry") and find_spec("opentelemetry.sdk")):
        raise ImproperlyConfigured(
            "DMX_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
            "pip install 'dmx-platform[tracing]'"
        )
