"""Circuit breakers in real Redis, shared by two boards as by two gateway replicas."""

import pytest

from apps.routing.breaker import BreakerBoard, BreakerState, breakers_key
from apps.routing.dispatcher import Dispatcher
from apps.routing.services import breaker_reset
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import run_with_redis
from tests.routing.factories import make_fleet, make_model_entry, make_snapshot, occupy

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")


async def refreshed(board: BreakerBoard) -> BreakerBoard:
    await board.refresh()
    return board


def test_three_failures_open_and_every_replica_sees_it(settings):
    settings.DMX_BREAKER_FAILURES = 3

    async def scenario(redis):
        a, b = BreakerBoard(redis), BreakerBoard(redis)
        states = []
        for _ in range(3):
            await a.record(7, failed=True)
            await refreshed(b)
            states.append(b.state(7))
        return states

    assert run_with_redis(scenario) == [BreakerState.CLOSED, BreakerState.CLOSED, BreakerState.OPEN]


def test_a_success_resets_the_count(settings):
    settings.DMX_BREAKER_FAILURES = 3

    async def scenario(redis):
        board = BreakerBoard(redis)
        await board.record(7, failed=True)
        await board.record(7, failed=True)
        await board.record(7, failed=False)
        await board.record(7, failed=True)
        await board.record(7, failed=True)
        return (await refreshed(BreakerBoard(redis))).state(7)

    assert run_with_redis(scenario) == BreakerState.CLOSED


def test_half_open_lets_one_probe_through_and_its_outcome_decides(settings):
    settings.DMX_BREAKER_FAILURES = 1
    settings.DMX_BREAKER_COOLDOWN_SECONDS = 0.2

    async def scenario(redis):
        import asyncio

        board = BreakerBoard(redis)
        await board.record(7, failed=True)
        assert board.state(7) is BreakerState.OPEN
        await asyncio.sleep(0.25)
        assert board.state(7) is BreakerState.HALF_OPEN
        other = await refreshed(BreakerBoard(redis))
        first, second = await board.try_probe(7), await other.try_probe(7)
        await board.record(7, failed=True)  # the probe failed: open again
        reopened = board.state(7)
        await asyncio.sleep(0.25)
        third = await other.try_probe(7)
        await other.record(7, failed=False)  # this probe succeeded: closed
        closed = (await refreshed(BreakerBoard(redis))).state(7)
        return first, second, reopened, third, closed

    first, second, reopened, third, closed = run_with_redis(scenario)
    assert (first, second) == (True, False)
    assert reopened is BreakerState.OPEN
    assert third is True and closed is BreakerState.CLOSED


def test_healthy_traffic_writes_nothing():
    async def scenario(redis):
        board = BreakerBoard(redis)
        for _ in range(5):
            await board.record(7, failed=False)
        return sync_redis().exists(breakers_key())

    assert run_with_redis(scenario) == 0


@pytest.mark.django_db  # the reset is written to the audit log (tests/audit)
def test_an_operator_can_reset_a_breaker(settings):
    settings.DMX_BREAKER_FAILURES = 1

    async def open_it(redis):
        await BreakerBoard(redis).record(7, failed=True)

    run_with_redis(open_it)
    assert sync_redis().hexists(breakers_key(), "7")
    breaker_reset(node_id=7)
    assert not sync_redis().hexists(breakers_key(), "7")


def slow_outcomes(
    settings, *, nodes, node, others_inflight=0, sla_ms=None, ttft_ms=5000.0, prompt_tokens=100
):
    """Three slow first tokens on `node` observed by a gateway's dispatcher; the breaker's
    state."""

    settings.DMX_BREAKER_FAILURES = 3
    settings.DMX_BREAKER_SLOW_TTFT_SECONDS = 2.0
    settings.DMX_BREAKER_SLOW_SLA_FACTOR = 4.0

    async def scenario(redis):
        dispatcher = Dispatcher(redis)
        dispatcher.fleet.replace({str(n.id).encode(): n.encode() for n in nodes})
        occupy(dispatcher.fleet, node, 1 + others_inflight)  # ours and the others
        model = make_model_entry(sla_ttft_p95_ms=sla_ms)
        for _ in range(3):
            await dispatcher.observe(
                node,
                failed=False,
                ttft_ms=ttft_ms,
                model=model,
                prompt_tokens=prompt_tokens,
                others_on_node=dispatcher.fleet.others_on(node, since=0.0),
            )
        return (await refreshed(BreakerBoard(redis))).state(node.id)

    return run_with_redis(scenario)


def test_slow_first_tokens_on_an_idle_node_open_it_when_another_can_serve(settings):
    sick, healthy = make_snapshot(), make_snapshot()
    assert slow_outcomes(settings, nodes=[sick, healthy], node=sick) is BreakerState.OPEN


def test_slowness_behind_other_requests_is_load_not_failure(settings):
    """A burst queues on the node: its first tokens come late, and that is no reason to take
    the node away (it once closed the only healthy one for ten seconds)."""
    busy, other = make_snapshot(), make_snapshot()
    assert (
        slow_outcomes(settings, nodes=[busy, other], node=busy, others_inflight=5)
        is BreakerState.CLOSED
    )
    engine_busy = make_snapshot(num_requests_running=4, num_requests_waiting=9)
    assert (
        slow_outcomes(settings, nodes=[engine_busy, other], node=engine_busy) is BreakerState.CLOSED
    )


def test_the_last_healthy_node_is_never_opened_on_slowness_alone(settings):
    lone = make_snapshot(model="lonely")
    assert slow_outcomes(settings, nodes=[lone], node=lone) is BreakerState.CLOSED
    stale = make_snapshot(model="lonely", heartbeat_at=0.0)  # not live: no alternative
    assert slow_outcomes(settings, nodes=[lone, stale], node=lone) is BreakerState.CLOSED


def test_slow_is_relative_to_the_models_target(settings):
    a, b = make_snapshot(), make_snapshot()
    # 5 s against a 2 s target: 2.5 times it, under the factor of 4.
    assert slow_outcomes(settings, nodes=[a, b], node=a, sla_ms=2000) is BreakerState.CLOSED
    # 5 s against a 1 s target: five times it.
    assert slow_outcomes(settings, nodes=[a, b], node=a, sla_ms=1000) is BreakerState.OPEN


def test_a_long_prompts_slow_first_token_is_its_prefill_not_a_failure(settings):
    a, b = make_snapshot(), make_snapshot()
    settings.DMX_BREAKER_SLOW_PROMPT_TOKENS = 4096
    assert (
        slow_outcomes(settings, nodes=[a, b], node=a, prompt_tokens=100_000) is BreakerState.CLOSED
    )


def test_a_heartbeat_from_before_a_request_was_sent_does_not_count_it():
    """The engine's count includes our request only if its heartbeat came after we sent it:
    otherwise the one it reports running is someone else's."""
    import time

    sent = time.time()
    before = make_snapshot(num_requests_running=1, heartbeat_at=sent - 1)
    after = make_snapshot(num_requests_running=1, heartbeat_at=sent + 1)
    fleet = make_fleet(before, after)
    occupy(fleet, before, 1)  # ours
    occupy(fleet, after, 1)
    assert fleet.others_on(before, since=sent) == 1
    assert fleet.others_on(after, since=sent) == 0
