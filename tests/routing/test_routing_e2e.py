"""Routing with two real vLLM workers serving dmx-tiny (versions v1 and v2): load, breaker
state, drain, the canary split and prefix affinity each change where requests go."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections import Counter

from django.conf import settings

from apps.billing.models import UsageRecord
from apps.hardware.nodestate import NodeSnapshot
from apps.models.models import ModelVersion
from apps.routing.services import breaker_reset, canary_start
from tests.conftest import fleet_node, wait_for_refresh
from tests.http import call
from tests.stack import tiny_prompt_counter, wait_for

MODEL = "dmx-tiny"
# A long prompt for the tiny model, whose context is 2,048 tokens.
LONG_PROMPT_TOKENS = 1_600
CORPUS_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "explain", "how")


def ask(platform, content: str = "hi", *, system: str | None = None, max_tokens: int = 2) -> str:
    messages = [{"role": "user", "content": content}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
    reply = call(
        "POST", platform.api_url + "/chat/completions", key=platform.api_key, json_body=body
    )
    assert reply.status == 200, (reply.body, decision_of(reply.headers["x-request-id"]))
    return reply.headers["x-request-id"]


def long_prompt(tag: str, tokens: int = LONG_PROMPT_TOKENS) -> str:
    """About `tokens` tokens, opening with `tag`: each prompt's first group (512 tokens) is its
    own, so no prefix sent anywhere before draws it."""
    counter = tiny_prompt_counter()
    words = tokens
    while True:
        text = f"{tag} " + " ".join(CORPUS_WORDS[i % len(CORPUS_WORDS)] for i in range(words))
        if counter.count_text(text) <= tokens:
            return text
        words = words * 9 // 10


def decision_of(request_id: str):
    """The routing decision the log kept for a request (every unrouted one is kept)."""
    from apps.routing.models import RoutingDecision

    decision = wait_for(
        lambda: RoutingDecision.objects.filter(request_id=request_id).first(),
        timeout=10,
        what="the decision log",
    )
    return [(c["node"], c["rejected_by"]) for c in decision.candidates["nodes"]]


def nodes_of(request_ids: list[str]) -> Counter:
    """Which node served each request, from the usage ledger."""
    records = wait_for(
        lambda: (
            (
                rows := list(
                    UsageRecord.objects.filter(request_id__in=request_ids).values_list(
                        "node", flat=True
                    )
                )
            )
            and len(rows) == len(request_ids)
            and rows
        ),
        timeout=20,
        what="the requests' usage records",
    )
    return Counter(records)


def node_name(platform, worker_key: str) -> str:
    return platform.workers[worker_key].node_name


def snapshot(name: str) -> NodeSnapshot:
    node = fleet_node(name)
    if node is None:
        raise LookupError(name)
    return node


def test_both_nodes_take_traffic_when_idle(platform, committed):
    served = nodes_of([ask(platform, f"question {i}") for i in range(16)])
    assert set(served) == {node_name(platform, "dmx-tiny"), node_name(platform, "dmx-tiny-v2")}


def test_load_on_a_node_sends_requests_to_the_other(platform, committed):
    """Long generations sent straight to one engine make it busy; the gateway routes around."""
    busy = platform.workers["dmx-tiny"]
    url = f"http://127.0.0.1:{busy.port}/v1/completions"
    payload = json.dumps(
        {"model": MODEL, "prompt": "go", "max_tokens": 1000, "ignore_eos": True}
    ).encode()
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            request = urllib.request.Request(
                url, data=payload, headers={"Content-Type": "application/json"}
            )
            urllib.request.urlopen(request, timeout=120).read()

    # Enough running requests that the busy node's predicted wait outweighs its cached prefix,
    # so prefix affinity yields to load. Long ones: a heartbeat landing between one request's
    # end and the next one's start sees fewer (with 200-token requests the busy node once took
    # 4 of 10). Not more clients: with 16 the two cores fell so far behind that both nodes'
    # heartbeats went stale.
    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(12)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: snapshot(busy.node_name).engine.num_requests_running >= 10,
            timeout=15,
            what="the busy node's heartbeat to show its load",
        )
        wait_for_refresh(platform)
        served = nodes_of([ask(platform, f"load {i}") for i in range(10)])
        assert served[node_name(platform, "dmx-tiny-v2")] >= 8, served
        # The real engine's inter-token latency reaches the heartbeat as a decode speed.
        wait_for(
            lambda: snapshot(busy.node_name).engine.decode_tokens_per_second > 0,
            timeout=10,
            what="the busy engine's decode speed",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)


def test_an_open_breaker_takes_a_node_out_and_a_reset_brings_it_back(platform, committed, settings):
    from apps.routing.breaker import BreakerBoard
    from tests.keys.factories import run_with_redis

    victim = snapshot(node_name(platform, "dmx-tiny"))

    async def open_breaker(redis):
        board = BreakerBoard(redis)
        for _ in range(settings.DMX_BREAKER_FAILURES):
            await board.record(victim.id, failed=True)

    run_with_redis(open_breaker)
    try:
        wait_for_refresh(platform)
        served = nodes_of([ask(platform, f"breaker {i}") for i in range(8)])
        assert set(served) == {node_name(platform, "dmx-tiny-v2")}, served
    finally:
        breaker_reset(node_id=victim.id)
    wait_for_refresh(platform)
    served = nodes_of([ask(platform, f"after reset {i}") for i in range(16)])
    assert node_name(platform, "dmx-tiny") in served


def _decisions(ids: list[str]) -> list:
    """What routing decided for up to ten of `ids`: pool, and each node's version and refusal."""
    from apps.routing.models import RoutingDecision

    try:
        decisions = wait_for(
            lambda: list(RoutingDecision.objects.filter(request_id__in=ids)[:10]),
            timeout=10,
            what="routing decisions in the ledger",
        )
    except TimeoutError:
        return []  # none sampled: the failure stands on its own figures
    return [
        (d.candidates["pool"], [(c["version"], c["rejected_by"]) for c in d.candidates["nodes"]])
        for d in decisions
    ]


def test_canary_split_follows_the_percentage(platform, committed):
    v2 = ModelVersion.objects.get(model__name=MODEL, tag="v2")
    canary_start(version=v2, percent=25)
    try:
        wait_for_refresh(platform)
        ids = [ask(platform, f"canary {i}") for i in range(40)]
        served = nodes_of(ids)
        share = served[node_name(platform, "dmx-tiny-v2")] / len(ids)
        # Only on a failure: the routing decisions behind it, once the ledger has some.
        assert 0.05 <= share <= 0.5, (served, _decisions(ids))
        versions = Counter(
            UsageRecord.objects.filter(request_id__in=ids).values_list("model_version", flat=True)
        )
        assert set(versions) == {"v1", "v2"}
        # Deterministic: each request's version follows from its id alone.
        from apps.routing.router import split_bucket

        for request_id, version in UsageRecord.objects.filter(request_id__in=ids).values_list(
            "request_id", "model_version"
        ):
            assert (split_bucket(request_id) < 25) == (version == "v2")
    finally:
        v2.is_stable, v2.canary_percent = True, 0
        v2.save()
        from apps.models.services import catalog_invalidate

        catalog_invalidate()
        wait_for_refresh(platform)


def test_prefix_affinity_keeps_a_shared_system_prompt_on_one_node(platform, committed):
    system = "You are the support assistant of a shipping company. " * 8
    served = nodes_of([ask(platform, f"where is parcel {i}?", system=system) for i in range(10)])
    assert len(served) == 1, served
    other_prefixes = nodes_of([ask(platform, f"{i} " * 40) for i in range(16)])
    assert len(other_prefixes) == 2, other_prefixes


def test_a_draining_node_gets_no_new_requests(platform, committed):
    """The worker's heartbeats are paused and a draining one sent in its name."""
    worker = platform.workers["dmx-tiny"]
    node = snapshot(worker.node_name)
    os.kill(worker.process.pid, signal.SIGSTOP)
    try:
        # A heartbeat sent just before the stop may still be on its way; let it land first, or
        # its "up" overwrites the "draining" below: none has landed for a whole interval.
        wait_for(
            lambda: (
                time.time() - snapshot(worker.node_name).heartbeat_at
                > settings.DMX_HEARTBEAT_SECONDS
            ),
            timeout=10,
            interval=0.05,
            what="the last heartbeat sent before the stop to land",
        )
        heartbeat = {"status": "draining", "engine": {}}
        reply = call(
            "POST",
            f"{platform.url}/internal/v1/nodes/{node.id}/heartbeat",
            json_body=heartbeat,
            headers={"Authorization": f"Bearer {platform.node_token}"},
        )
        assert reply.status == 200
        wait_for_refresh(platform)
        served = nodes_of([ask(platform, f"drain {i}") for i in range(8)])
        assert set(served) == {node_name(platform, "dmx-tiny-v2")}, served
    finally:
        os.kill(worker.process.pid, signal.SIGCONT)
    wait_for(lambda: snapshot(worker.node_name).status == "up", timeout=10, what="the node back up")


def gateway_inflight(platform, node: str) -> float:
    """Requests the gateway has in flight on `node`, from its /metrics."""
    body = call("GET", platform.url + "/metrics").body.decode()
    prefix = f'dmx_node_gateway_inflight_requests{{node="{node}"}} '
    return sum(float(line[len(prefix) :]) for line in body.splitlines() if line.startswith(prefix))


# The two prompts queued on the paused node, and the one routed: the paused node's work is
# seven times the prompt's own, a margin for the prefill rates the two engines measured earlier
# in the run, which the prediction divides by and which a loaded machine sets far apart (CI
# once read 18,050 and 1,672 tokens/s): the router holds twins within PEER_PREFILL_SPREAD of
# their mean, four times apart at most, and seven times the work stays ahead of that.
AHEAD_TOKENS = 1_900
GAMMA_TOKENS = 640


def test_a_long_prompt_goes_to_the_node_with_less_queued_work_not_fewer_requests(
    platform, committed
):
    """One node holds two long prompts it has not prefilled (its vLLM server is paused), the
    other four short ones it was decoding (paused after their first tokens): a long prompt goes
    to the node with four requests, because the two ahead of it on the other are more work."""
    from apps.hardware.models import Node
    from apps.hardware.services import node_drain, node_undrain

    paused, decoding = platform.workers["dmx-tiny"], platform.workers["dmx-tiny-v2"]
    paused_row = Node.objects.get(name=paused.node_name)
    decoding_row = Node.objects.get(name=decoding.node_name)

    def stream(content: str, max_tokens: int, first_chunk: threading.Event) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        request = urllib.request.Request(
            platform.api_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {platform.api_key}",
            },
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                if b'"content"' in line:
                    first_chunk.set()
                if line.startswith(b"data: [DONE]"):
                    break

    threads: list[threading.Thread] = []

    def start(content: str, max_tokens: int) -> threading.Event:
        event = threading.Event()
        thread = threading.Thread(target=stream, args=(content, max_tokens, event), daemon=True)
        thread.start()
        threads.append(thread)
        return event

    # Each engine's vLLM server is paused in turn (SIGSTOP): what the gateway has in flight
    # there stays exactly as it was sent, however fast or slow the machine runs today.
    engines = [paused.engine_pid(), decoding.engine_pid()]
    node_drain(node=decoding_row)
    os.kill(engines[0], signal.SIGSTOP)
    try:
        wait_for_refresh(platform)
        for tag in ("alpha", "beta"):
            start(long_prompt(tag, AHEAD_TOKENS), 1)
        wait_for(
            lambda: gateway_inflight(platform, paused.node_name) == 2,
            timeout=10,
            what="two long prompts in flight on the paused node",
        )
        node_undrain(node=decoding_row)
        node_drain(node=paused_row)
        wait_for_refresh(platform)
        firsts = [start(f"short {i}", 1_900) for i in range(4)]
        for first in firsts:
            assert first.wait(30), "a short request's first token"
        # Decoding, their prompts prefilled: held there, mid-generation, until the decision.
        os.kill(engines[1], signal.SIGSTOP)
        node_undrain(node=paused_row)
        wait_for_refresh(platform)
        assert gateway_inflight(platform, paused.node_name) == 2
        assert gateway_inflight(platform, decoding.node_name) == 4
        asked: list[str] = []
        gamma = threading.Thread(
            target=lambda: asked.append(
                ask(platform, long_prompt("gamma", GAMMA_TOKENS), max_tokens=1)
            ),
            daemon=True,
        )
        gamma.start()
        wait_for(
            lambda: (
                gateway_inflight(platform, paused.node_name)
                + gateway_inflight(platform, decoding.node_name)
                == 7
            ),
            timeout=10,
            what="the long prompt routed",
        )
        # What the prediction divided by, should a run disagree: each node's measured rates.
        rates = {
            worker.node_name: {
                name: getattr(snapshot(worker.node_name).engine, name)
                for name in ("prefill_tokens_per_second", "decode_tokens_per_second")
            }
            for worker in (paused, decoding)
        }
        assert gateway_inflight(platform, decoding.node_name) == 5, rates
        for engine in engines:
            os.kill(engine, signal.SIGCONT)
        gamma.join(timeout=120)
        assert nodes_of(asked) == Counter({decoding.node_name: 1})
    finally:
        for engine in engines:
            os.kill(engine, signal.SIGCONT)
        node_undrain(node=paused_row)
        node_undrain(node=decoding_row)
        for thread in threads:
            thread.join(timeout=120)


def test_a_prefix_cached_on_a_node_by_another_client_draws_its_prompts_there(platform, committed):
    """Long prompts sent to one engine directly (as another gateway's, or the engine's own
    client's, would be): its KV-cache events tell the gateway the node holds them, and the same
    prompts through the gateway go there. The holder is the node the gateway sends fewer new
    prompts to just then (latency, load): only what the engine reports draws them to it."""
    from inference.prefix_cache import PrefixFilter, chain_hashes

    probes = nodes_of([ask(platform, long_prompt(f"memo {i}:"), max_tokens=1) for i in range(4)])
    workers = [platform.workers["dmx-tiny"], platform.workers["dmx-tiny-v2"]]
    holder = min(workers, key=lambda worker: probes[worker.node_name])
    counter = tiny_prompt_counter()
    prompts = [long_prompt(f"report {i}:") for i in range(4)]
    expected = []
    for content in prompts:
        messages = [{"role": "user", "content": content}]
        expected.extend(chain_hashes(counter.chat_ids(messages)))
        direct = call(
            "POST",
            f"http://127.0.0.1:{holder.port}/v1/chat/completions",
            json_body={"model": MODEL, "messages": messages, "max_tokens": 1},
        )
        assert direct.status == 200, direct.body
    assert len(expected) == 4 * (LONG_PROMPT_TOKENS // 512)

    def holds_them() -> bool:
        text = snapshot(holder.node_name).engine.prefix_filter
        return bool(text) and all(h in PrefixFilter.decode(text) for h in expected)

    wait_for(holds_them, timeout=15, what="the holder's heartbeat to report the prefixes")
    wait_for_refresh(platform)
    served = nodes_of([ask(platform, content, max_tokens=1) for content in prompts])
    assert served == Counter({holder.node_name: 4}), (served, probes)
