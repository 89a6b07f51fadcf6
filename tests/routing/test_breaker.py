"""Circuit breakers in real Redis, shared by two boards as by two gateway replicas."""

import pytest

from apps.routing.breaker import BreakerBoard, BreakerState, breakers_key
from apps.routing.services import breaker_reset
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import run_with_redis


@pytest.fixture(autouse=True)
def _own_redis_keys(private_redis):
    """These tests' Redis keys are their own (tests/conftest.py)."""


async def refreshed(redis, board: BreakerBoard) -> BreakerBoard:
    board.replace(sync_redis().hgetall(breakers_key()))
    return board


def test_three_failures_open_and_every_replica_sees_it(settings):
    settings.DMX_BREAKER_FAILURES = 3

    async def scenario(redis):
        a, b = BreakerBoard(redis), BreakerBoard(redis)
        states = []
        for _ in range(3):
            await a.record(7, failed=True)
            await refreshed(redis, b)
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
        return (await refreshed(redis, BreakerBoard(redis))).state(7)

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
        other = await refreshed(redis, BreakerBoard(redis))
        first, second = await board.try_probe(7), await other.try_probe(7)
        await board.record(7, failed=True)  # the probe failed: open again
        reopened = board.state(7)
        await asyncio.sleep(0.25)
        third = await other.try_probe(7)
        await other.record(7, failed=False)  # this probe succeeded: closed
        closed = (await refreshed(redis, BreakerBoard(redis))).state(7)
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


def test_an_operator_can_reset_a_breaker(settings):
    settings.DMX_BREAKER_FAILURES = 1

    async def open_it(redis):
        await BreakerBoard(redis).record(7, failed=True)

    run_with_redis(open_it)
    assert sync_redis().hexists(breakers_key(), "7")
    breaker_reset(node_id=7)
    assert not sync_redis().hexists(breakers_key(), "7")
