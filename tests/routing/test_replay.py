"""The Router against four baselines on Mooncake's conversation trace (tests/routing/replay.py).

A sample keeps the run short: the trace's first 3,000 requests (of 12,031), time-compressed to
each load; `python -m tests.routing.replay` with DJANGO_SETTINGS_MODULE set prints the whole
table over every request.
"""

import pytest

from tests.routing.replay import POLICIES, load_trace, replay, report

SAMPLE = 3000


def test_the_trace_is_the_published_one():
    trace = load_trace()
    assert len(trace) == 12_031
    assert max(r[1] for r in trace) > 90_000  # prompts up to 126k tokens
    assert all(len(r[3]) == -(-r[1] // 512) for r in trace)  # one hash per 512-token block


@pytest.mark.parametrize("load", [0.8, 0.95])
def test_the_router_has_the_lowest_p95_ttft_and_near_highest_cache_hits(load, capsys):
    results = {p: replay(p, load=load, requests=SAMPLE) for p in POLICIES}
    with capsys.disabled():
        print("\n" + report(list(results.values())))
    router = results.pop("router")
    assert router.requests == SAMPLE and router.rejected == 0
    assert all(router.ttft[1] < other.ttft[1] for other in results.values())
    assert router.cache_hit_rate >= 0.9 * max(r.cache_hit_rate for r in results.values())
    # Cheaper than every baseline that spreads the load; prefix-greedy piles nearly everything on
    # one node (every prompt shares the first block), cheap per token and minutes to first token.
    spreading = ("round_robin", "least_loaded", "capacity_weighted")
    assert all(router.cost_per_1m_tokens <= results[p].cost_per_1m_tokens for p in spreading)


def test_the_replay_is_deterministic():
    first, second = (replay("router", load=0.8, requests=500) for _ in range(2))
    assert (first.ttft, first.cache_hit_rate) == (second.ttft, second.cache_hit_rate)
