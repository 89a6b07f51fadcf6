"""Each filter and scorer, and the decisions they make together."""

import hashlib
import time
from collections import Counter

import pytest

from apps.keys.choices import PriorityTier
from apps.models.catalog import VersionEntry
from apps.routing.breaker import Breaker
from apps.routing.router import cost_per_1k_tokens, mix64, split_bucket, version_pools
from tests.routing.factories import (
    make_model_entry,
    make_router,
    make_snapshot,
    occupy,
    route_request,
)

H100 = "nvidia-h100-sxm"


def chosen(router, request=None, **kwargs):
    decision = router.decide(request or route_request(), **kwargs)
    return decision.node.name if decision.node else None


def scores(decision, scorer: str) -> dict[str, float]:
    return {row["node"]: row["scores"][scorer] for row in decision.trace() if row["scores"]}


def verdicts(decision) -> dict[str, str | None]:
    return {v.node.name: v.rejected_by for v in decision.verdicts}


# Filters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"drained": True}, "drained"),
        ({"status": "draining"}, "live"),
        ({"status": "down"}, "live"),
        ({"heartbeat_at": time.time() - 60}, "live"),
        ({"version_id": 99}, "version"),
        ({"max_model_len": 150}, "context"),
        ({"kv_cache_usage": 0.99}, "kv_cache"),
        ({"temperature_c": 86.0}, "temperature"),
        ({"num_requests_waiting": 40}, "saturated"),
    ],
)
def test_each_filter_refuses_its_node_and_names_itself(override, reason):
    bad = make_snapshot(name="bad", **override)
    good = make_snapshot(name="good")
    decision = make_router(bad, good).decide(route_request())
    assert decision.node.name == "good"
    assert verdicts(decision) == {"bad": reason, "good": None}


def test_a_drained_node_gets_no_new_request_even_when_it_is_the_best():
    idle = make_snapshot(name="idle", drained=True)
    busy = make_snapshot(name="busy", num_requests_running=12, kv_cache_usage=0.8)
    router = make_router(idle, busy)
    assert {chosen(router) for _ in range(20)} == {"busy"}
    alone = make_router(make_snapshot(name="alone", drained=True))
    decision = alone.decide(route_request())
    # Nothing to route to, and not for load: the request is refused, not queued for the node.
    assert decision.node is None and not decision.saturated
    assert verdicts(decision) == {"alone": "drained"}
    assert alone.fleet.live_models() == set()  # /v1/models lists no model only it serves


def test_open_breaker_filters_half_open_does_not():
    a, b = make_snapshot(name="a"), make_snapshot(name="b", num_requests_waiting=5)
    router = make_router(a, b)
    router.breakers._breakers = {a.id: Breaker(state="open", failures=3, opened_at=time.time())}
    assert chosen(router) == "b"
    router.breakers._breakers = {
        a.id: Breaker(state="open", failures=3, opened_at=time.time() - 60)
    }
    assert router.breakers.state(a.id).value == "half_open"
    assert chosen(router) == "a"  # half-open: eligible; the pipeline then takes the probe


def test_excluded_nodes_are_not_retried():
    a, b = make_snapshot(name="a"), make_snapshot(name="b", num_requests_waiting=9)
    decision = make_router(a, b).decide(route_request(), exclude=[a.id])
    assert decision.node.name == "b" and verdicts(decision)["a"] == "retry"


@pytest.mark.parametrize(
    ("max_num_seqs", "inflight", "saturated"),
    [
        (0, 15, False),  # batch unknown: every request in flight counts as queued
        (0, 16, True),
        (256, 64, False),  # running in the engine's batch, not waiting
        (256, 271, False),  # 15 beyond the batch wait in the engine's queue
        (256, 272, True),
    ],
)
def test_requests_within_the_engines_batch_do_not_saturate_it(max_num_seqs, inflight, saturated):
    node = make_snapshot(name="node", max_num_seqs=max_num_seqs)
    router = make_router(node)
    occupy(router.fleet, node, inflight)
    decision = router.decide(route_request())
    assert decision.saturated is saturated
    assert verdicts(decision) == {"node": "saturated" if saturated else None}


def test_a_request_waits_for_a_busy_node_that_fits_it_and_not_for_one_too_short():
    busy = make_snapshot(name="busy", num_requests_waiting=50)
    assert make_router(busy).decide(route_request()).saturated
    # A node whose context is too short would not serve it anyway: the busy one will, soon.
    small = make_snapshot(name="small", max_model_len=10)
    decision = make_router(busy, small).decide(route_request())
    assert decision.node is None and decision.saturated and not decision.too_long
    assert verdicts(decision) == {"busy": "saturated", "small": "context"}
    # No node could ever serve it: refused at once, not queued.
    alone = make_router(small, make_snapshot(name="smaller", max_model_len=8))
    decision = alone.decide(route_request())
    assert decision.too_long and not decision.saturated and decision.longest_context == 10
    # Nodes down or with open breakers are no capacity now, not too short.
    down = make_snapshot(name="down", status="down")
    decision = make_router(small, down).decide(route_request())
    assert not decision.too_long and not decision.saturated


# Scorers ---------------------------------------------------------------------------------------


def test_queue_depth_moves_traffic():
    busy = make_snapshot(name="busy", num_requests_running=6, num_requests_waiting=2)
    idle = make_snapshot(name="idle")
    assert chosen(make_router(busy, idle)) == "idle"


def test_this_gateways_inflight_requests_count_before_the_next_heartbeat():
    a, b = make_snapshot(name="a"), make_snapshot(name="b")
    router = make_router(a, b)
    first = chosen(router)
    occupy(router.fleet, a if first == "a" else b, 3)
    assert chosen(router) != first


def test_memory_bandwidth_pressure_is_a_bottleneck_even_with_free_memory():
    saturated_bus = make_snapshot(name="bus", memory_bandwidth_utilization=0.92, kv_cache_usage=0.1)
    fuller = make_snapshot(name="fuller", memory_bandwidth_utilization=0.3, kv_cache_usage=0.5)
    assert chosen(make_router(saturated_bus, fuller)) == "fuller"


def test_temperature_derates_from_78c():
    # One request running on an H100 (its profile's prefill rate) is a small load.
    hot = make_snapshot(name="hot", temperature_c=83.0, profile=H100)
    warm = make_snapshot(name="warm", temperature_c=77.0, num_requests_running=1, profile=H100)
    decision = make_router(hot, warm).decide(route_request())
    temperature = scores(decision, "temperature")
    assert temperature["warm"] == 1.0 and temperature["hot"] == pytest.approx(1 - 5 / 7, abs=1e-4)
    assert decision.node.name == "warm"


def test_latency_against_the_model_sla():
    model = make_model_entry(sla_latency_p95_ms=1000)
    slow = make_snapshot(name="slow", e2e_p95_ms=4000.0, profile=H100)
    fast = make_snapshot(name="fast", e2e_p95_ms=800.0, num_requests_running=1, profile=H100)
    decision = make_router(slow, fast).decide(route_request(model))
    assert scores(decision, "latency") == {"slow": 0.25, "fast": 1.0}
    assert decision.node.name == "fast"


def test_without_an_sla_the_work_a_node_served_does_not_count_against_it():
    """Nodes' P95s say what work they were given: two idle nodes share new requests even when
    one served long generations in the window and the other short ones (a full CI run once
    sent all sixteen of a test's requests to the node with the shorter work behind it)."""
    long_work, short_work = make_snapshot(name="long"), make_snapshot(name="short")
    router = make_router(long_work, short_work)
    for _ in range(20):
        router.stats.record(long_work.id, ttft_ms=40.0, latency_ms=30_000.0, failed=False)
        router.stats.record(short_work.id, ttft_ms=40.0, latency_ms=300.0, failed=False)
    decision = router.decide(route_request())
    assert scores(decision, "latency") == {"long": 1.0, "short": 1.0}
    picks = Counter(chosen(router, route_request(affinity=key)) for key in range(40))
    assert set(picks) == {"long", "short"}, picks


def test_gateway_observed_latency_wins_over_the_engine_report():
    node = make_snapshot(name="n", e2e_p95_ms=100.0)
    router = make_router(node)
    for _ in range(20):
        router.stats.record(node.id, ttft_ms=None, latency_ms=900.0, failed=False)
    from apps.routing.router import node_latency_p95

    assert node_latency_p95(router.stats, node) == 900.0


def test_cost_per_1k_tokens_prefers_the_cheaper_node():
    # $4/h at 1000 tok/s = 4 / 3600 per 1000 tokens; $2/h at 1000 tok/s is half.
    dear = make_snapshot(name="dear", hourly_price_usd=4.0, generation_tokens_per_second=1000.0)
    cheap = make_snapshot(name="cheap", hourly_price_usd=2.0, generation_tokens_per_second=1000.0)
    assert cost_per_1k_tokens(dear) == pytest.approx(4 / 3600)
    decision = make_router(dear, cheap, weights={"cost": 1.0}).decide(route_request())
    assert scores(decision, "cost") == {"dear": 0.5, "cheap": 1.0}
    assert decision.node.name == "cheap"


def test_prefix_affinity_keeps_a_prefix_on_one_node_until_it_is_busy():
    nodes = [make_snapshot(name=f"n{i}") for i in range(4)]
    router = make_router(*nodes)
    picks = {chosen(router, route_request(affinity=12345)) for _ in range(10)}
    assert len(picks) == 1
    others = {chosen(router, route_request(affinity=key)) for key in range(200, 260)}
    assert len(others) > 1  # different prefixes spread out
    (favourite,) = picks
    node = next(n for n in nodes if n.name == favourite)
    occupy(router.fleet, node, 10)  # overloaded: affinity yields
    assert chosen(router, route_request(affinity=12345)) != favourite


def test_affinity_is_the_same_in_every_process():
    """Gateway replicas must agree on a prefix's node: no per-process hash seed may leak in."""
    import subprocess
    import sys

    code = "from apps.routing.router import mix64; print(mix64(12345, 7), mix64(99, 3))"
    env = {"PYTHONHASHSEED": "12345", "DMX_DEBUG": "1"}
    import os

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout.split()
    assert [int(x) for x in out] == [mix64(12345, 7), mix64(99, 3)]
    assert mix64(1, 1) != mix64(1, 2)


def test_hardware_preference():
    a = make_snapshot(name="a100", profile="nvidia-a100-sxm4-80gb")
    h = make_snapshot(name="h100", profile="nvidia-h100-sxm", num_requests_running=1)
    request = route_request(preferred_profiles=frozenset({"nvidia-h100-sxm"}))
    assert chosen(make_router(a, h), request) == "h100"


# Canary split ----------------------------------------------------------------------------------


def canary_model(percent: float):
    return make_model_entry(
        versions={
            1: VersionEntry(id=1, tag="v1", is_stable=True, canary_percent=0.0),
            2: VersionEntry(id=2, tag="v2", is_stable=False, canary_percent=percent),
            3: VersionEntry(id=3, tag="v0", is_stable=False, canary_percent=0.0),
        }
    )


def test_canary_takes_its_share_deterministically():
    model = canary_model(20.0)
    ids = ["req_" + hashlib.md5(str(i).encode()).hexdigest() for i in range(2000)]
    pools = [version_pools(model, rid)[0] for rid in ids]
    share = pools.count("canary:v2") / len(pools)
    assert 0.17 < share < 0.23
    assert pools == [version_pools(model, rid)[0] for rid in ids]  # the same every time
    assert split_bucket(ids[7]) == split_bucket(ids[7])


def test_canary_pool_falls_back_to_stable_and_retired_versions_get_nothing():
    model = canary_model(100.0)
    stable = make_snapshot(name="stable", version_id=1)
    retired = make_snapshot(name="retired", version_id=3)
    decision = make_router(stable, retired).decide(route_request(model))
    assert decision.fallback and decision.node.name == "stable"
    assert verdicts(decision)["retired"] == "version"


def test_trace_names_every_step():
    a = make_snapshot(name="a", status="draining")
    b = make_snapshot(name="b")
    trace = make_router(a, b).decide(route_request()).trace()
    assert [row["rejected_by"] for row in trace] == ["live", None]
    assert trace[0]["scores"] == {}
    assert set(trace[1]["scores"]) == {
        "queue",
        "kv_cache",
        "bandwidth",
        "temperature",
        "latency",
        "cost",
        "affinity",
        "hardware",
    }


@pytest.mark.parametrize(
    ("load", "spare"),
    [
        ({}, True),
        ({"num_requests_waiting": 1}, False),  # anyone waits: no spare capacity
        ({"kv_cache_usage": 0.6}, False),  # DMX_BATCH_MAX_KV_CACHE
        ({"kv_cache_usage": 0.59}, True),
        ({"num_requests_running": 8}, False),  # half of its 16 sequences (DMX_BATCH_MAX_BUSY)
        ({"num_requests_running": 7}, True),
    ],
)
def test_a_batch_request_goes_only_to_spare_capacity_and_waits_for_it(load, spare):
    node = make_snapshot(name="node", max_num_seqs=16, **load)
    router = make_router(node)
    batch = router.decide(route_request(priority=PriorityTier.BATCH, batch_line=True))
    assert verdicts(batch) == {"node": None if spare else "spare"}
    assert batch.saturated is not spare  # refused, it waits in the queue for room
    # An interactive request on the same node is not held to it, a batch-tier key's neither.
    assert verdicts(router.decide(route_request())) == {"node": None}
    assert verdicts(router.decide(route_request(priority=PriorityTier.BATCH))) == {"node": None}


@pytest.mark.parametrize(
    ("target_ms", "ttft_p95_ms", "spare"),
    [
        (400, 150, True),
        (400, 201, False),  # past DMX_BATCH_TTFT_SLA_SHARE (half) of the model's target
        (400, None, True),  # the engine finished nothing lately: nothing slowed
        (None, 5_000, True),  # no target: the occupancy thresholds alone
    ],
)
def test_a_batch_request_yields_as_the_models_first_tokens_slow_towards_its_target(
    target_ms, ttft_p95_ms, spare
):
    node = make_snapshot(name="node", max_num_seqs=16, ttft_p95_ms=ttft_p95_ms)
    model = make_model_entry(sla_ttft_p95_ms=target_ms)
    router = make_router(node)
    batch = router.decide(route_request(model, priority=PriorityTier.BATCH, batch_line=True))
    assert verdicts(batch) == {"node": None if spare else "spare"}
    assert verdicts(router.decide(route_request(model))) == {"node": None}


def test_a_batch_request_counts_what_this_process_has_in_flight_on_the_node():
    node = make_snapshot(name="node", max_num_seqs=16)
    router = make_router(node)
    occupy(router.fleet, node, 8)
    batch = route_request(priority=PriorityTier.BATCH, batch_line=True)
    assert verdicts(router.decide(batch)) == {"node": "spare"}
