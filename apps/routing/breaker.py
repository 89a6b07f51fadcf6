"""Circuit breakers per node, shared by every gateway replica through Redis.

Closed: traffic flows; consecutive failures (errors, timeouts, and a first token slower than the
model allows that the node's load does not explain: slow_first_token) are counted. At
DMX_BREAKER_FAILURES it opens: no traffic. After
the cooldown it is half-open: the one gateway request that takes the probe key goes through;
its success closes the breaker, its failure opens it again. Gateways read every breaker with
their periodic state refresh; outcomes are written only when they change something (a failure,
or a success on a node with failures), so healthy traffic costs no Redis write.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from django.conf import settings

from dmxplatform.redis_client import rkey
from dmxplatform.resp import ClusterRespClient, RedisUnavailable, RespClient, RespError, Script

logger = logging.getLogger(__name__)

_LUA = (Path(__file__).parent / "lua" / "breaker.lua").read_text()


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# In the request store, in one hash slot: breaker.lua writes both keys in one call.
_TAG = "{breakers}"


def breakers_key() -> str:
    return rkey(_TAG)


def probe_key(node_id: int) -> str:
    return rkey(_TAG, "probe", node_id)


@dataclass(frozen=True, slots=True)
class Breaker:
    state: str  # as stored: "closed" or "open"
    failures: int
    opened_at: float  # seconds

    @classmethod
    def parse(cls, raw: bytes) -> Breaker:
        state, failures, opened_ms = raw.decode().split()
        return cls(state=state, failures=int(failures), opened_at=int(opened_ms) / 1000)

    def current(self, now: float, cooldown: float) -> BreakerState:
        if self.state != BreakerState.OPEN:
            return BreakerState.CLOSED
        return BreakerState.OPEN if now - self.opened_at < cooldown else BreakerState.HALF_OPEN


CLOSED = Breaker(state=BreakerState.CLOSED, failures=0, opened_at=0.0)


def slow_ttft_limit_ms(sla_ttft_p95_ms: int | None) -> float:
    """A first token slower than this is slow for a breaker: DMX_BREAKER_SLOW_SLA_FACTOR times
    the model's P95 target, or DMX_BREAKER_SLOW_TTFT_SECONDS for a model without one."""
    if sla_ttft_p95_ms:
        return sla_ttft_p95_ms * settings.DMX_BREAKER_SLOW_SLA_FACTOR
    return settings.DMX_BREAKER_SLOW_TTFT_SECONDS * 1000


def slow_limit_ms(sla_ttft_p95_ms: int | None, predicted_ttft_ms: float | None) -> float:
    """The slow limit for one request: slow_ttft_limit_ms, or DMX_BREAKER_SLOW_SLA_FACTOR times
    the first-token time the router predicted for it on its node (its queue and prefill at the
    node's rate), whichever is later: a node is slow against what it should do, not against a
    figure an L4 misses with any long prompt."""
    limit = slow_ttft_limit_ms(sla_ttft_p95_ms)
    if predicted_ttft_ms:
        limit = max(limit, predicted_ttft_ms * settings.DMX_BREAKER_SLOW_SLA_FACTOR)
    return limit


def slow_first_token(
    *,
    ttft_ms: float,
    limit_ms: float,
    prompt_tokens: int,
    others_on_node: int,
    healthy_alternatives: int,
) -> bool:
    """Whether a first token counts as a failure of its node.

    Only when it is slower than the limit, for a prompt of ordinary length, on a node that had
    nothing else to do: a long prompt's prefill takes its time anywhere, and waiting behind
    other requests is load, which the router spreads and the admission queue sheds (503 with
    Retry-After); a breaker opened by load takes capacity away exactly when it is short (a
    burst of long prompts once closed the only healthy node for its cooldown). And never when
    no other healthy node serves the model: slowness alone does not close the last one.
    """
    return (
        ttft_ms > limit_ms
        and prompt_tokens <= settings.DMX_BREAKER_SLOW_PROMPT_TOKENS
        and others_on_node == 0
        and healthy_alternatives > 0
    )


class BreakerBoard:
    """One gateway process's view of every breaker, and the writes that change them."""

    def __init__(self, redis: RespClient | ClusterRespClient) -> None:
        self._redis = redis
        self._record = Script(_LUA)
        self._breakers: dict[int, Breaker] = {}

    async def refresh(self) -> None:
        """Reload every breaker (with the gateway's periodic state refresh); keep the last
        ones read while the request store does not answer, which must not make the fleet's
        state look stale (on a cluster, one master of many holds the breakers)."""
        try:
            raw = await self._redis.execute(b"HGETALL", breakers_key())
        except (RedisUnavailable, RespError) as exc:
            logger.warning("breakers not refreshed: %s", exc)
            return
        self._breakers = {int(raw[i]): Breaker.parse(raw[i + 1]) for i in range(0, len(raw), 2)}

    def get(self, node_id: int) -> Breaker:
        return self._breakers.get(node_id, CLOSED)

    def state(self, node_id: int, now: float | None = None) -> BreakerState:
        return self.get(node_id).current(
            time.time() if now is None else now, settings.DMX_BREAKER_COOLDOWN_SECONDS
        )

    async def try_probe(self, node_id: int) -> bool:
        """Take the half-open node's single probe; False when another request has it."""
        ttl_ms = int(settings.DMX_BREAKER_COOLDOWN_SECONDS * 1000)
        taken = await self._redis.execute(b"SET", probe_key(node_id), 1, b"NX", b"PX", ttl_ms)
        return taken is not None

    async def record(self, node_id: int, *, failed: bool) -> None:
        """Count an outcome; a success on a clean breaker is not worth a round trip."""
        breaker = self.get(node_id)
        if not failed and breaker.state == BreakerState.CLOSED and breaker.failures == 0:
            return
        result = await self._redis.run(
            self._record,
            [breakers_key(), probe_key(node_id)],
            [node_id, 1 if failed else 0, settings.DMX_BREAKER_FAILURES],
        )
        state, *rest = result.decode().split()
        self._breakers[node_id] = (
            Breaker(state=state, failures=breaker.failures + 1, opened_at=int(rest[0]) / 1000)
            if state == BreakerState.OPEN
            else Breaker(state=state, failures=breaker.failures + 1 if failed else 0, opened_at=0.0)
        )
