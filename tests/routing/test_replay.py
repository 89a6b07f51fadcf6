"""The Router against capacity-weighted least-loaded and prefix-greedy, replayed on two public
traces through modelled vLLM engines (tests/routing/replay.py, tests/routing/engine.py).

The slices are locked: Mooncake's requests 8,000-8,999 and Azure's 4,500-5,999, inside the
segments the README reports (Mooncake 6,000 on, Azure 3,500 on), apart from the segments the
router's constants were chosen on (Mooncake 1,000-3,999, Azure 1,000-3,499). Each way of
sending max_tokens at each load is one case, and any of them may fail: the router must have the
lowest TTFT p95, and a cache hit rate no lower than two thirds of prefix-greedy's.
`python -m tests.routing.replay` with DJANGO_SETTINGS_MODULE set prints the README's tables.
"""

import pytest

from tests.routing.replay import WAYS, load_trace, replay, report

SLICES = {"mooncake": (8000, 1000), "azure": (4500, 1500)}
BASELINES = ("capacity_weighted", "prefix_greedy")


def test_the_traces_are_the_published_ones():
    mooncake = load_trace("mooncake")
    assert len(mooncake) == 12_031
    assert max(r.prompt for r in mooncake) > 90_000  # prompts up to 126k tokens
    assert all(len(r.hashes) == -(-r.prompt // 512) for r in mooncake)  # a hash per 512 tokens
    azure = load_trace("azure")
    assert len(azure) == 6_000
    assert all(r.hashes == () for r in azure)  # no prefix information in it
    assert azure[-1].arrival > 1_000  # 20 minutes of arrivals


@pytest.mark.parametrize("trace", sorted(SLICES))
@pytest.mark.parametrize("load", [0.6, 0.8, 0.95])
def test_the_router_has_the_lowest_p95_ttft_every_way_max_tokens_is_sent(trace, load, capsys):
    first, count = SLICES[trace]
    rows = []
    for way in WAYS:
        results = {
            policy: replay(policy, trace=trace, way=way, load=load, first=first, requests=count)
            for policy in (*BASELINES, "router")
        }
        rows.extend(results.values())
        router = results["router"]
        assert router.requests == count and router.rejected == 0
        for policy in BASELINES:
            assert router.ttft[1] < results[policy].ttft[1], (way, policy, router, results[policy])
        assert router.cache_hit_rate >= results["prefix_greedy"].cache_hit_rate * 2 / 3, way
    with capsys.disabled():
        print("\n" + report(rows))


def test_the_replay_is_deterministic():
    first, second = (
        replay("router", trace="mooncake", way="2048", load=0.8, first=8000, requests=300)
        for _ in range(2)
    )
    assert (first.ttft, first.cache_hit_rate) == (second.ttft, second.cache_hit_rate)
