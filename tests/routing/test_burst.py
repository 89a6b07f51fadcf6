"""A burst against a model's only node: its queueing makes first tokens late, and that is load,
not failure. It used to open the slow-first-token breaker of the only healthy node, and 43 of
the next 64 requests got 503 for the breaker's cooldown."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings

from apps.hardware.models import Node
from apps.routing.breaker import breakers_key
from dmxplatform.redis_client import sync_redis
from tests.conftest import TINY_CONTEXT, wait_until_served
from tests.faults import assert_recorded_once, send_chat, send_chat_stream
from tests.keys.factories import make_api_key
from tests.models.factories import make_model

pytestmark = pytest.mark.e2e
BURST = 32
AFTER = 64
# A first token slower than four times this is slow for a breaker: 0.4 s, which a burst of long
# prompts on two shared cores exceeds many times over.
TTFT_TARGET_MS = 100


def long_prompt(index: int) -> str:
    """About 1,200 tokens, distinct from every other (no prefix cache to share)."""
    return f"Request {index:02d}: " + " ".join(f"word{index:02d}x{n}" for n in range(160))


@pytest.fixture
def lone_node(platform, committed):
    model = f"dmx-lone-{uuid.uuid4().hex[:6]}"
    make_model(model, max_context_tokens=TINY_CONTEXT, sla_ttft_p95_ms=TTFT_TARGET_MS)
    worker = platform.stack.start_worker(model_name=model, node_token=platform.node_token)
    wait_until_served(platform, model, worker)
    yield model, worker
    worker.stop()


def test_a_burst_on_the_only_node_opens_no_breaker(platform, committed, lone_node):
    model, worker = lone_node
    api_key, key = make_api_key()

    def burst(index: int):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": long_prompt(index)}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        return send_chat_stream(platform.api_url, key, body)

    with ThreadPoolExecutor(BURST) as pool:
        results = list(pool.map(burst, range(BURST)))
    sent = [reply for reply, _ in results]
    assert [s.status for s in sent] == [200] * BURST
    assert min(s.prompt_tokens for s in sent) > 1000
    # The premise: queueing made enough first tokens slower than the breaker's limit to open it
    # three times over, were they counted.
    ttfts = sorted(ttft for _, ttft in results)
    assert ttfts[-3 * settings.DMX_BREAKER_FAILURES] > 4 * TTFT_TARGET_MS / 1000, ttfts

    node = Node.objects.get(name=worker.node_name)
    breaker = sync_redis().hget(breakers_key(), str(node.id))
    assert breaker is None or not breaker.startswith(b"open"), breaker

    small = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(lambda _: send_chat(platform.api_url, key, small), range(AFTER)))
    assert [s.status for s in after] == [200] * AFTER
    assert_recorded_once(sent + after, key=api_key)
