"""The usage buffer: a Redis stream between the gateway and PostgreSQL.

The gateway appends one event per finished request (one XADD, no database on the hot path);
`apps.keys.services.usage_flush` moves them into UsageRecord in batches and acknowledges them
only after the rows are committed, so a crash anywhere between leaves them pending, never lost.
Inserts are idempotent on request_id, so a batch retried after a partial failure is harmless.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import orjson
import redis.asyncio as aioredis

from dmxplatform.redis_client import rkey

STREAM = ("usage", "stream")
DEAD_LETTER_STREAM = ("usage", "dead")
GROUP = "ledger"
FIELD = b"e"


@dataclass(slots=True)
class UsageEvent:
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
    timings: dict[str, float] = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> UsageEvent:
        return cls(**orjson.loads(raw))


def stream_key() -> str:
    return rkey(*STREAM)


def dead_letter_key() -> str:
    return rkey(*DEAD_LETTER_STREAM)


async def usage_append(redis: aioredis.Redis, event: UsageEvent) -> None:
    """Buffer one usage event. Never trimmed: entries leave only when flushed."""
    await redis.xadd(stream_key(), {FIELD: event.encode()})
