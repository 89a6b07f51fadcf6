"""Admission leases against real Redis: fewer round trips, the same limits, exact accounting."""

import asyncio
import time

import pytest

from apps.keys.keycache import KeyRecord, Limits, Quota
from apps.keys.leases import MIN_LEASE_REQUESTS, LeaseBook
from apps.keys.limiter import Limiter
from apps.keys.ratelimit import Meter, Rule, rules_for
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_key_record, run_with_redis

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")

LEASE = 16


class CountingRedis:
    """The request path's client, counting the admissions and give-backs it runs (settling
    goes through submit)."""

    def __init__(self, redis) -> None:
        self.redis = redis
        self.calls = 0

    async def run(self, script, keys, args):
        self.calls += 1
        return await self.redis.run(script, keys, args)

    async def submit(self, script, keys, args):
        return await self.redis.submit(script, keys, args)


def limiter_for(redis, *, ttl: float = 60.0) -> Limiter:
    return Limiter(CountingRedis(redis), LeaseBook(requests=LEASE, ttl=ttl))


def busy_key() -> KeyRecord:
    return make_key_record(
        tenant_limits=Limits(requests_per_minute=10_000, max_concurrent_requests=1_000),
        key_limits=Limits(tokens_per_minute=1_000_000),
        quotas=(Quota(scope="key", period="day", model="", tokens=10_000_000),),
    )


def rule(rules: tuple[Rule, ...], meter: str) -> Rule:
    (found,) = [r for r in rules if r.meter == meter]
    return found


def bucket_level(rule_: Rule) -> float:
    return float(sync_redis().hget(rule_.key, "v"))


def assert_spent(rule_: Rule, spent: int, since: float) -> None:
    """The bucket lacks `spent`, less what it refilled since `since` (time.monotonic())."""
    refill = (time.monotonic() - since) * 1000 * rule_.param
    assert rule_.limit - spent <= bucket_level(rule_) <= rule_.limit - spent + refill


def test_a_busy_rule_set_is_admitted_from_a_lease_between_round_trips():
    record = busy_key()

    async def scenario(redis):
        limiter = limiter_for(redis)
        rules = rules_for(record, model="m")
        admissions = [await limiter.admit(f"req_{i}", rules, tokens=10) for i in range(20)]
        return limiter, admissions

    limiter, admissions = run_with_redis(scenario)
    assert all(a.admitted for a in admissions)
    # The first admission marks the key busy, the second brings a lease of 16 requests, which
    # admits the next 16; the 19th renews it.
    assert limiter._redis.calls == 3
    # Each request holds its own slot: its id, or one of the lease's slots.
    members = [a.member for a in admissions]
    assert len(set(members)) == 20
    assert members[:2] == ["req_0", "req_1"] and all(":" in m for m in members[2:18])
    # Headers keep counting down between round trips.
    remaining = [dict(a.headers())[b"x-ratelimit-remaining-requests"] for a in admissions[1:4]]
    assert [int(r) for r in remaining] == [9_998, 9_997, 9_996]


def test_a_lease_counts_at_once_for_every_replica():
    record = busy_key()
    rules = rules_for(record, model="m")

    async def scenario(redis):
        limiter = limiter_for(redis)
        for i in range(2):
            await limiter.admit(f"req_{i}", rules, tokens=10)

    started = time.monotonic()
    run_with_redis(scenario)
    # Two requests and a lease of 16 with 10 tokens each, as another gateway would see them.
    assert_spent(rule(rules, Meter.REQUESTS), 18, started)
    assert_spent(rule(rules, Meter.TOKENS), 180, started)
    assert int(sync_redis().get(rule(rules, Meter.QUOTA).key)) == 180
    assert sync_redis().zcard(rule(rules, Meter.CONCURRENCY).key) == 18


def test_two_replicas_with_leases_admit_exactly_the_limit():
    """Two processes alternate until both are refused: the limit is reached and never passed,
    although each held leases on the way (the last 16 or so go one at a time)."""
    record = make_key_record(key_limits=Limits(requests_per_minute=200))
    rules = rules_for(record, model="m")

    async def scenario(redis):
        first, second = limiter_for(redis), limiter_for(redis)
        admitted, refused_in_a_row, i = 0, 0, 0
        while refused_in_a_row < 2:
            limiter = (first, second)[i % 2]
            admission = await limiter.admit(f"req_{i}", rules, tokens=1)
            admitted += admission.admitted
            refused_in_a_row = 0 if admission.admitted else refused_in_a_row + 1
            i += 1
        return admitted, first._redis.calls + second._redis.calls

    started = time.monotonic()
    admitted, calls = run_with_redis(scenario)
    refill = (time.monotonic() - started) * 200 / 60  # requests the bucket regained meanwhile
    assert 200 <= admitted <= 200 + refill + 1
    assert calls < admitted / 2  # and most of them without a round trip


def test_usage_and_quotas_stay_exact_once_leases_are_given_back():
    record = busy_key()
    rules = rules_for(record, model="m")

    async def scenario(redis):
        limiter = limiter_for(redis)
        for i in range(30):
            admission = await limiter.admit(f"req_{i}", rules, tokens=100)
            await limiter.settle(admission, refund=100 - 37, events=[])
        return await limiter.end_leases(everything=True)

    started = time.monotonic()
    assert run_with_redis(scenario) == 1
    assert int(sync_redis().get(rule(rules, Meter.QUOTA).key)) == 30 * 37
    assert sync_redis().zcard(rule(rules, Meter.CONCURRENCY).key) == 0
    assert_spent(rule(rules, Meter.REQUESTS), 30, started)
    assert_spent(rule(rules, Meter.TOKENS), 30 * 37, started)


def test_an_expired_lease_admits_nothing_and_is_given_back_by_the_sweep():
    record = busy_key()
    rules = rules_for(record, model="m")

    async def scenario(redis):
        limiter = limiter_for(redis, ttl=0.05)
        for i in range(2):
            await limiter.admit(f"req_{i}", rules, tokens=10)
        held = sync_redis().zcard(rule(rules, Meter.CONCURRENCY).key)
        await asyncio.sleep(0.06)
        calls = limiter._redis.calls
        late = await limiter.admit("req_late", rules, tokens=10)  # asks Redis: the lease ended
        asked = limiter._redis.calls - calls
        given_back = await limiter.end_leases()
        return held, asked, late, given_back

    held, asked, late, given_back = run_with_redis(scenario)
    assert held == 2 + LEASE
    assert asked == 1 and late.member == "req_late"
    # The late request's lease replaced the expired one, which the sweep gave back; the new
    # one runs for its own 50 ms.
    assert given_back == 1
    # Left held: the three requests (never settled here) and the new lease's slots.
    assert sync_redis().zcard(rule(rules, Meter.CONCURRENCY).key) == 3 + LEASE


def test_a_key_near_its_limits_is_admitted_one_request_at_a_time():
    # A lease takes at most a quarter of what is left, and is not worth fewer than four
    # requests: with 15 requests a minute no lease is ever granted.
    record = make_key_record(key_limits=Limits(requests_per_minute=4 * MIN_LEASE_REQUESTS - 1))

    async def scenario(redis):
        limiter = limiter_for(redis)
        rules = rules_for(record, model="m")
        admissions = [await limiter.admit(f"req_{i}", rules, tokens=1) for i in range(16)]
        return limiter._redis.calls, admissions

    calls, admissions = run_with_redis(scenario)
    assert calls == 16
    assert [a.admitted for a in admissions] == [True] * 15 + [False]


def test_signed_requests_never_use_a_lease():
    record = busy_key()

    async def scenario(redis):
        limiter = limiter_for(redis)
        for i in range(3):  # the unsigned rule set gets its lease
            await limiter.admit(f"req_{i}", rules_for(record, model="m"), tokens=1)
        calls = limiter._redis.calls
        for i in range(5):
            rules = rules_for(record, model="m", nonce=f"n{i}")
            assert (await limiter.admit(f"signed_{i}", rules, tokens=1)).admitted
        return limiter._redis.calls - calls

    assert run_with_redis(scenario) == 5


def test_only_one_lease_is_asked_for_at_a_time():
    """Concurrent requests of a busy rule set while a grant is on its way ask Redis plainly,
    rather than each bringing back a lease of its own."""
    record = busy_key()
    rules = rules_for(record, model="m")

    async def scenario(redis):
        limiter = limiter_for(redis)
        await limiter.admit("req_first", rules, tokens=10)
        await asyncio.gather(*(limiter.admit(f"req_{i}", rules, tokens=10) for i in range(8)))

    started = time.monotonic()
    run_with_redis(scenario)
    assert_spent(rule(rules, Meter.REQUESTS), 9 + LEASE, started)
