"""Priority under saturation, across two gateway replicas: an engine running vLLM's priority
scheduling, its batch full of batch-tier streams from both replicas and more of them queued in
it; a priority-tier request's first token comes before any of the queued ones' (issue 30).

The order holds in the engine's queue, whichever replica sent what: gateways send a saturated
node requests until its queue reaches DMX_ROUTE_SATURATION_QUEUE (16), each with its key's tier
as vLLM's priority. Past that, requests wait in each replica's own admission queue, ordered by
tier within that replica only (README, Routing).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest

from apps.billing.models import UsageRecord
from apps.keys.choices import PriorityTier
from tests.conftest import TINY_CONTEXT, fleet_node, serving_worker
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.stack import MAX_NUM_SEQS, wait_for

# The batch full (the workers' --max-num-seqs) and eight more queued in the engine: under the
# gateways' saturation queue, so every one of them reaches the engine.
QUEUED = 8
LOW_STREAMS = MAX_NUM_SEQS + QUEUED
# Batch stream i generates LOW_TOKENS + i * TOKENS_APART tokens. vLLM admits a waiting request
# only when a running one ends (a full batch is not preempted for priority), so the lengths are
# apart: one slot frees at a time, which the priority request takes, and the next frees some
# hundred decode steps later. Were they equal, the batch would end in one step and admit the
# priority request and queued batch ones together. At least LOW_TOKENS: no stream ends before
# the priority request is in; at most the context (2,048) less the prompt, and the running
# ones' sum under DMX_ROUTE_KV_CACHE_LIMIT (all at 1,900 went over it: 503).
LOW_TOKENS = 400
TOKENS_APART = 65


@pytest.fixture(scope="module")
def priority_model(platform, django_db_blocker):
    """A model of its own on one engine (scheduling by priority, as every worker's engine)."""
    with django_db_blocker.unblock():
        model = f"dmx-priority-{uuid.uuid4().hex[:6]}"
        make_model(model, max_context_tokens=TINY_CONTEXT)
    with serving_worker(platform, model) as worker:
        yield model, worker


def test_a_priority_request_passes_batch_streams_queued_in_the_engine_from_two_replicas(
    platform, committed, priority_model
):
    model, worker = priority_model
    assert fleet_node(worker.node_name).priority_scheduling
    _, batch = make_api_key(priority=PriorityTier.BATCH)
    _, priority = make_api_key(priority=PriorityTier.PRIORITY)
    first_token: dict[int, float] = {}  # by stream: the batch ones 0.., the priority one -1
    request_ids: list[str] = []

    async def stream(client, index: int, key: str, tokens: int) -> None:
        """A stream through one replica or the other. Its headers come with its first token:
        the gateway holds them until the node has answered."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"{uuid.uuid4()} go on"}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {key}"}
        url = platform.api_urls[index % 2] + "/chat/completions"
        async with client.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            request_ids.append(response.headers["x-request-id"])
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first_token.setdefault(index, time.monotonic())

    async def scenario() -> tuple[set[int], set[int]]:
        limits = httpx.Limits(max_connections=LOW_STREAMS + 1)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            low = [
                asyncio.ensure_future(stream(client, i, batch, LOW_TOKENS + i * TOKENS_APART))
                for i in range(LOW_STREAMS)
            ]
            deadline = time.monotonic() + 90
            while not (
                len(first_token) >= MAX_NUM_SEQS
                and (fleet_node(worker.node_name).engine.num_requests_waiting or 0) >= QUEUED // 2
            ):
                assert time.monotonic() < deadline, len(first_token)
                assert not any(task.done() for task in low), [t for t in low if t.done()]
                await asyncio.sleep(0.05)
            queued = set(range(LOW_STREAMS)) - first_token.keys()
            high = asyncio.ensure_future(stream(client, -1, priority, 4))
            while -1 not in first_token:
                assert time.monotonic() < deadline, "no first token for the priority request"
                assert not high.done() or high.exception() is None, high.exception()
                await asyncio.sleep(0.01)
            passed = queued - first_token.keys()
            await high
            for task in low:  # leaving closes the streams: the engine stops them
                task.cancel()
            await asyncio.gather(*low, return_exceptions=True)
            return queued, passed

    queued, passed = asyncio.run(scenario())
    # The premise: batch streams were queued in the engine when the priority request came.
    assert len(queued) >= QUEUED // 2, queued
    assert passed == queued, f"{len(queued - passed)} queued batch streams went first"
    # Every stream that got an answer is in the ledger once (those cut before their first
    # token have no id the client saw), the priority one served in full.
    records = wait_for(
        lambda: (
            rows
            if len(rows := list(UsageRecord.objects.filter(request_id__in=request_ids)))
            == len(request_ids)
            else None
        ),
        timeout=60,
        what=f"{len(request_ids)} usage records",
    )
    assert {r.request_id for r in records} == set(request_ids)
    assert sum(r.status == "ok" and r.completion_tokens == 4 for r in records) == 1
