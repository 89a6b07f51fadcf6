"""Routing by predicted work: queued prompt tokens, hardware rates, prefix blocks, KV queueing."""

import pytest

from apps.routing.breaker import slow_limit_ms
from apps.routing.router import (
    PEER_PREFILL_SPREAD,
    PREFIX_BLOCK_TOKENS,
    node_rates,
    predicted_ttft,
    predicted_wait,
    profile_rates,
)
from apps.routing.work import WorkFigures, WorkTable
from inference.prefix_cache import PrefixFilter, chain_hashes
from tests.routing.factories import heartbeat, make_router, make_snapshot, occupy, route_request

LONG = 131_072  # a context that fits every prompt here


def chosen(router, request=None) -> str | None:
    decision = router.decide(request or route_request())
    return decision.node.name if decision.node else None


def test_the_node_with_less_queued_work_wins_not_the_one_with_fewer_requests():
    few = make_snapshot(name="few", max_model_len=LONG)
    many = make_snapshot(name="many", max_model_len=LONG)
    router = make_router(few, many)
    for node, prompts in ((few, [60_000]), (many, [200, 200, 200])):
        for tokens in prompts:
            router.fleet.begin(node.id, prompt_tokens=tokens, completion_tokens=100)
    assert chosen(router, route_request(prompt_tokens=30_000)) == "many"


def test_a_faster_gpu_predicts_a_sooner_first_token():
    h100 = make_snapshot(name="h100", profile="nvidia-h100-sxm", gpu_count=1, max_model_len=LONG)
    l4 = make_snapshot(name="l4", profile="nvidia-l4", gpu_count=1, max_model_len=LONG)
    router = make_router(h100, l4)
    request = route_request(prompt_tokens=20_000)
    assert (
        predicted_ttft(router.fleet, h100, request) < predicted_ttft(router.fleet, l4, request) / 5
    )
    assert chosen(router, request) == "h100"
    # Unknown hardware predicts at a modest fallback rate rather than failing.
    assert profile_rates(None, 0)[0] > 0


def test_first_tokens_and_endings_take_work_off_the_node():
    node = make_snapshot()
    router = make_router(node)
    ticket = router.fleet.begin(node.id, prompt_tokens=5000, completion_tokens=50)
    assert router.fleet.work[node.id].prefill_tokens == 5000
    router.fleet.prefilled(ticket)
    assert router.fleet.work[node.id].prefill_tokens == 0
    router.fleet.end(ticket)
    work = router.fleet.work[node.id]
    assert (work.requests, work.prefilling, work.decode_tokens) == (0, 0, 0)


def test_a_prompt_goes_where_its_prefix_was_sent_until_that_node_is_busy():
    nodes = [make_snapshot(name=f"n{i}", max_model_len=LONG) for i in range(3)]
    router = make_router(*nodes)
    shared = (1, 2, 3, 4, 5, 6, 7, 8)
    router.fleet.begin(nodes[2].id, prompt_tokens=10, completion_tokens=1, blocks=shared)
    request = route_request(prompt_tokens=8 * 512, prefix_blocks=(*shared, 99))
    assert router.fleet.cached_blocks(nodes[2].id, request.prefix_blocks) == 8
    assert chosen(router, request) == "n2"
    occupy(router.fleet, nodes[2], 10)  # the load guard: affinity yields
    assert chosen(router, request) != "n2"


def test_a_full_kv_cache_queues_the_request_instead_of_refusing_it():
    full = make_snapshot(kv_cache_usage=0.99)
    decision = make_router(full).decide(route_request())
    assert decision.node is None and decision.saturated


def test_slowness_is_measured_against_the_prediction(settings):
    settings.DMX_BREAKER_SLOW_TTFT_SECONDS = 2.0
    settings.DMX_BREAKER_SLOW_SLA_FACTOR = 4.0
    assert slow_limit_ms(None, None) == 2000
    assert slow_limit_ms(None, 100.0) == 2000  # a fast prediction keeps the floor
    assert slow_limit_ms(None, 3000.0) == 12_000  # 4 times a 3 s prediction


A100 = "nvidia-a100-sxm4-80gb"


def a100(name: str, **overrides):
    """A node of one A100, with a context that fits every prompt here."""
    return make_snapshot(name=name, profile=A100, gpu_count=1, max_model_len=LONG, **overrides)


def test_a_measured_prefill_rate_overrides_the_profile_and_scales_the_unmeasured_nodes():
    # Two nodes of one hardware profile: the profile alone cannot tell them apart.
    slow, other = a100("slow"), a100("other")
    profile_rate = profile_rates(A100, 1)[0]
    router = make_router(slow, other)
    request = route_request(prompt_tokens=20_000)
    assert node_rates(router.fleet, slow).prefill == node_rates(router.fleet, other).prefill

    # The engine of one measured a third of what the profile predicts for the reference model.
    slow = a100("slow", id=slow.id, prefill_tokens_per_second=profile_rate / 3)
    router = make_router(slow, other)
    assert node_rates(router.fleet, slow).prefill == pytest.approx(profile_rate / 3)
    # The unmeasured node serves the same model: its profile's figure is scaled alike, so the
    # two compare in this model's terms and the measured one is not penalised for measuring.
    assert node_rates(router.fleet, other).prefill == pytest.approx(profile_rate / 3)

    # Measured slower than its twin (its engine is shared, throttled...): the other one wins.
    fast = a100("fast", id=other.id, prefill_tokens_per_second=profile_rate)
    router = make_router(slow, fast)
    assert predicted_ttft(router.fleet, slow, request) == pytest.approx(
        3 * predicted_ttft(router.fleet, fast, request)
    )
    assert chosen(router, request) == "fast"


def test_twins_measured_ten_times_apart_are_held_within_the_peer_spread():
    """Two identical engines, one measured alone (fast), one under concurrent prefills (slow):
    the readings CI once saw. Two 1,900-token prompts wait on the "fast" one, four short ones
    decode on the other: the long prompt still goes to the one with less work ahead."""
    fast = make_snapshot(name="fast", max_model_len=LONG, prefill_tokens_per_second=18_049.9)
    slow = make_snapshot(
        name="slow", max_model_len=LONG, prefill_tokens_per_second=1_672.1, num_requests_running=4
    )
    router = make_router(fast, slow)
    mean = (18_049.9 * 1_672.1) ** 0.5
    assert node_rates(router.fleet, fast).prefill == pytest.approx(mean * PEER_PREFILL_SPREAD)
    assert node_rates(router.fleet, slow).prefill == pytest.approx(mean / PEER_PREFILL_SPREAD)
    for _ in range(2):
        router.fleet.begin(fast.id, prompt_tokens=1_900, completion_tokens=1)
    for _ in range(4):
        router.fleet.prefilled(
            router.fleet.begin(slow.id, prompt_tokens=20, completion_tokens=1_900)
        )
    heartbeat(router.fleet, fast, slow)  # the one that counted the four running
    assert chosen(router, route_request(prompt_tokens=640, completion_tokens=1)) == "slow"


def test_a_node_whose_requests_just_started_is_not_taken_for_a_slow_decoder():
    """Two long prompts wait unprefilled on one node; on the other, four requests had their
    first tokens in its last heartbeat's window (2 s, the default): four tokens generated, four
    running. A shorter prompt goes to the second, since one sequence decodes there at the speed
    its engine measured between tokens, not at that window's tokens over its requests (half a
    token a second, which predicted even this one-token answer a second of decoding)."""
    queued = make_snapshot(name="queued", max_model_len=LONG, prefill_tokens_per_second=12_000)
    started = make_snapshot(
        name="started",
        max_model_len=LONG,
        prefill_tokens_per_second=12_000,
        num_requests_running=4,
        generation_tokens_per_second=2.0,
        decode_tokens_per_second=60.0,
    )
    router = make_router(queued, started)
    for _ in range(2):
        router.fleet.begin(queued.id, prompt_tokens=1_900, completion_tokens=1)
    for _ in range(4):
        ticket = router.fleet.begin(started.id, prompt_tokens=20, completion_tokens=1_900)
        router.fleet.prefilled(ticket)
    assert node_rates(router.fleet, started).decode == 60.0
    # Not measured yet: the profile's step rate.
    assert node_rates(router.fleet, queued).decode == profile_rates(None, 0)[1]
    assert chosen(router, route_request(prompt_tokens=640, completion_tokens=1)) == "started"


def test_a_prefix_the_nodes_engine_reports_counts_as_cached_whoever_sent_it():
    """Another gateway (or a client of the engine's own) sent the prompt: this gateway's index
    has nothing, the engine's KV-cache events say the node holds it. Routing is given the
    prompt's token ids and hashes them as the engine does."""
    ids = list(range(3 * PREFIX_BLOCK_TOKENS))
    held = chain_hashes(ids[: 2 * PREFIX_BLOCK_TOKENS])
    holder = make_snapshot(
        name="holder", max_model_len=LONG, prefix_filter=PrefixFilter.of(held).encode()
    )
    other = make_snapshot(name="other", max_model_len=LONG)
    router = make_router(holder, other)
    blocks = chain_hashes(ids)
    assert router.fleet.cached_blocks(holder.id, blocks) == 2
    assert router.fleet.cached_blocks(other.id, blocks) == 0
    decision = router.decide(route_request(prompt_tokens=len(ids), prompt_ids=ids))
    assert decision.node.name == "holder"
    assert scores_of(decision)["holder"]["affinity"] == round(2 / 3, 4)  # the trace rounds
    # A damaged filter is no claim, and no failure.
    broken = make_snapshot(name="broken", max_model_len=LONG, prefix_filter="###")
    assert make_router(broken).fleet.cached_blocks(broken.id, blocks) == 0


def scores_of(decision) -> dict[str, dict[str, float]]:
    return {row["node"]: row["scores"] for row in decision.trace()}


def test_a_prompt_no_node_holds_goes_home_by_its_hash_unless_another_is_sooner():
    nodes = [make_snapshot(name=f"n{i}", max_model_len=LONG) for i in range(4)]
    router = make_router(*nodes)
    homes = set()
    for i in range(40):
        blocks = chain_hashes([i, *range(PREFIX_BLOCK_TOKENS)])
        request = route_request(prompt_tokens=PREFIX_BLOCK_TOKENS + 1, prefix_blocks=blocks)
        first = router.decide(request).node.name
        # The same prompt from another gateway (a router of its own) goes to the same node.
        assert make_router(*nodes).decide(request).node.name == first
        homes.add(first)
    assert len(homes) == 4  # new prompts spread over idle nodes
    # The home with a long prompt queued ahead loses to an idle node: it saves nothing now.
    blocks = chain_hashes(list(range(PREFIX_BLOCK_TOKENS)))
    request = route_request(prompt_tokens=PREFIX_BLOCK_TOKENS, prefix_blocks=blocks)
    home = router.decide(request).node
    router.fleet.begin(home.id, prompt_tokens=20_000, completion_tokens=10)
    assert router.decide(request).node.name != home.name


H100, L4 = "nvidia-h100-sxm", "nvidia-l4"


def test_a_node_whose_kv_cache_is_full_waits_for_its_running_decodes_to_finish():
    """An L4 holds about 40k tokens of an 8B model's KV cache. Nearly full, a new 8k-token
    prompt waits there for running requests to finish, which their predicted decode work says:
    long ones, and an H100 with prompts queued is sooner; short ones, and room comes soon."""
    full = make_snapshot(
        name="full",
        profile=L4,
        gpu_count=1,
        max_model_len=32_768,
        kv_cache_usage=0.9,
        decode_tokens_per_second=20.0,
    )
    queued = make_snapshot(name="queued", profile=H100, gpu_count=1, max_model_len=LONG)
    router = make_router(full, queued)
    router.work = WorkTable(by_intent={("m", ""): WorkFigures(100, 2_000, 4_000)})
    assert 30_000 < node_rates(router.fleet, full).kv_tokens < 50_000
    occupy(router.fleet, queued, 6, prompt_tokens=8_000)

    def running(completion: int) -> list:
        tickets = [
            router.fleet.begin(full.id, prompt_tokens=9_000, completion_tokens=completion)
            for _ in range(4)
        ]
        for ticket in tickets:
            router.fleet.prefilled(ticket)
        heartbeat(router.fleet, full, queued)
        return tickets

    tickets = running(2_000)
    request = route_request(prompt_tokens=8_000, completion_tokens=None, max_tokens=None)
    assert router.decide(request).node.name == "queued"
    assert request.completion_tokens == 2_000  # predicted: the model's median
    assert predicted_wait(router.fleet, full, request) > 10  # 2,000 tokens at 20 tokens/s
    for ticket in tickets:
        router.fleet.end(ticket)
    running(20)
    short = route_request(prompt_tokens=8_000, completion_tokens=20)
    assert predicted_wait(router.fleet, full, short) < 1


def test_a_node_whose_batch_is_full_waits_for_a_slot():
    full = make_snapshot(
        name="full", max_num_seqs=4, max_model_len=LONG, decode_tokens_per_second=20.0
    )
    router = make_router(full)
    for ticket in occupy(router.fleet, full, 4):
        router.fleet.prefilled(ticket)  # decoding: no prompt queued ahead
    heartbeat(router.fleet, full)
    # The four running ones are predicted 100 tokens each: a slot frees in about a quarter of
    # their five seconds.
    request = route_request(prompt_tokens=10, completion_tokens=100)
    assert predicted_wait(router.fleet, full, request) == pytest.approx(100 / 20 / 4)


def test_prefix_affinity_weighs_the_saved_prefill_against_the_nodes_wait():
    holder, other = (
        make_snapshot(name=name, profile=H100, gpu_count=1, max_model_len=LONG, max_num_seqs=64)
        for name in ("holder", "other")
    )
    router = make_router(holder, other)
    blocks = tuple(range(1, 41))  # 20k tokens
    router.fleet.begin(holder.id, prompt_tokens=10, completion_tokens=1, blocks=blocks)
    request = route_request(prompt_tokens=40 * PREFIX_BLOCK_TOKENS, prefix_blocks=blocks)
    idle = scores_of(router.decide(request))["holder"]["affinity"]
    assert idle > 0.9  # the whole prompt, and almost no wait
    # However many requests it runs (no count switches it off), what matters is their wait.
    for ticket in occupy(router.fleet, holder, 40, prompt_tokens=1):
        router.fleet.prefilled(ticket)
    assert scores_of(router.decide(request))["holder"]["affinity"] > 0.9
    assert router.decide(request).node.name == "holder"
    # A long prompt queued ahead: the cached prefix saves less than the wait costs.
    router.fleet.begin(holder.id, prompt_tokens=200_000, completion_tokens=1)
    assert scores_of(router.decide(request))["holder"]["affinity"] < 0.2 * idle
    assert router.decide(request).node.name == "other"
