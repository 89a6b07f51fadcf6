"""The usage buffer: Redis streams (one per request-store shard) between the gateway and
PostgreSQL.

The gateway appends one event per finished request (inside the settle script that
apps.keys.limiter runs, so no database and no extra round trip on the hot path);
`apps.billing.services.usage_flush` moves them into UsageRecord in batches (dmxplatform.streams),
idempotent on request_id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dmxplatform.records import JsonRecord
from dmxplatform.streams import DurableStream

USAGE_STREAM = DurableStream(("usage", "stream"), title="Usage events")
# What a gateway logs, before the event's JSON, when Redis failed mid-request and the event could
# not be appended (apps.gateway.pipeline); `manage.py usage_replay` appends such lines later.
UNRECORDED = "usage-unrecorded"
# UsageRecord.model's length: a model name as a client asked for it is cut to this.
MODEL_CHARS = 128


@dataclass(slots=True)
class UsageEvent(JsonRecord):
    request_id: str
    api_key_id: int
    tenant_id: int
    created_at: float
    endpoint: str
    model: str
    status: str
    http_status: int
    stream: bool = False
    model_version: str = ""
    node: str = ""
    error_code: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: float = 0.0
    time_to_first_token_ms: float | None = None
    intent: str = ""
    # Entries appended before these two fields existed have neither: they drain with defaults.
    intent_confidence: float | None = None
    intent_low_confidence: bool = False
    estimated_prompt_tokens: int | None = None
    context_limit: int | None = None
    content_flags: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # The client's own id for the request (X-Client-Request-Id), and the OpenTelemetry trace
    # the request's spans belong to (when tracing is on).
    client_request_id: str = ""
    trace_id: str = ""
    # Prompt tokens the engine served from its cache, and what the request cost (micro-units of
    # DMX_CURRENCY, at the prices in force when it arrived); a prepaid tenant's is charged.
    cached_tokens: int = 0
    cost_micros: int = 0
    prepaid: bool = False
    # The batch (/v1/batches) the request ran in: billed at its batch price.
    batch_id: str = ""
