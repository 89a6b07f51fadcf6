"""The router against round-robin on a simulated fleet of three dozen mixed GPUs."""

from tests.routing.simulation import report, simulate


def test_router_beats_round_robin_on_latency_without_costing_more(capsys):
    router = simulate("router")
    round_robin = simulate("round_robin")
    with capsys.disabled():
        print("\n" + report([router, round_robin]))
    assert router.requests == round_robin.requests == 4000
    # Round-robin keeps feeding the slow and degraded nodes their full share; their queues grow.
    assert router.p95_s < 0.5 * round_robin.p95_s
    assert router.p50_s < round_robin.p50_s
    assert router.cost_per_1k_tokens <= round_robin.cost_per_1k_tokens


def test_the_simulation_is_deterministic():
    first, second = simulate("round_robin", requests=500), simulate("round_robin", requests=500)
    assert (first.p95_s, first.cost_per_1k_tokens) == (second.p95_s, second.cost_per_1k_tokens)
