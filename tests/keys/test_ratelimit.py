"""The admit and settle scripts against real Redis: buckets, slots, quotas, nonces, refunds."""

from datetime import UTC, datetime

import orjson
import pytest

from apps.billing import ledger
from apps.billing.counters import period_bounds
from apps.keys.keycache import KeyRecord, Limits, Quota
from apps.keys.limiter import (
    Limiter,
    _admit_row,
    _admit_spec,
    _cached_spec,
    _settle_row,
    _settle_spec,
)
from apps.keys.ratelimit import Meter, format_duration, rules_for
from apps.keys.signing import REPLAY_TTL_SECONDS
from dmxplatform import streams
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_key_record, run_with_redis

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")

# The default request store: one shard.
USAGE = ledger.USAGE_STREAM.shard(0)


def key(**overrides) -> KeyRecord:
    return make_key_record(**overrides)


def run(scenario):
    """Without leases (tests/keys/test_leases.py has them): every admission asks Redis."""
    return run_with_redis(lambda redis: scenario(Limiter(redis)))


def admit_many(record: KeyRecord, count: int, *, tokens: int = 10, model: str = "m"):
    async def scenario(limiter):
        results = []
        for i in range(count):
            rules = rules_for(record, model=model)
            results.append(await limiter.admit(f"req_{i}", rules, tokens=tokens))
        return results

    return run(scenario)


def test_requests_per_minute_across_tenant_and_key():
    results = admit_many(key(tenant_limits=Limits(requests_per_minute=3)), 4)
    assert [r.admitted for r in results] == [True, True, True, False]
    refused = results[-1]
    assert refused.failed.meter == Meter.REQUESTS
    # One request comes back every 60 / 3 = 20 s.
    assert 19_000 <= refused.retry_after_ms <= 20_000


def test_the_tighter_of_plan_and_key_wins():
    record = key(
        tenant_limits=Limits(requests_per_minute=100), key_limits=Limits(requests_per_minute=2)
    )
    assert [r.admitted for r in admit_many(record, 3)] == [True, True, False]


def test_a_refused_request_reserves_nothing():
    """Atomicity: the key's token bucket refuses, so the tenant's request bucket is untouched."""
    record = key(
        tenant_limits=Limits(requests_per_minute=10),
        key_limits=Limits(tokens_per_minute=100),
    )

    async def scenario(limiter):
        big = await limiter.admit("req_big", rules_for(record, model="m"), tokens=150)
        small = await limiter.admit("req_small", rules_for(record, model="m"), tokens=10)
        return big, small

    big, small = run(scenario)
    assert not big.admitted and big.retry_after_ms == -1  # larger than the limit: never fits
    requests_left = dict(zip([r.meter for r in small.rules], small.remaining, strict=True))
    assert requests_left[Meter.REQUESTS][0] == 9  # only the small request was counted


def test_headers_report_the_tightest_buckets():
    record = key(
        tenant_limits=Limits(requests_per_minute=60, tokens_per_minute=1000),
        key_limits=Limits(requests_per_minute=5),
    )
    admission = admit_many(record, 1, tokens=100)[0]
    headers = dict(admission.headers())
    assert headers[b"x-ratelimit-limit-requests"] == b"5"
    assert headers[b"x-ratelimit-remaining-requests"] == b"4"
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"900"
    assert headers[b"x-ratelimit-reset-tokens"] == b"6s"  # 100 tokens at 1000/min


def test_concurrency_slots_are_freed_by_settle():
    record = key(key_limits=Limits(max_concurrent_requests=2))

    async def scenario(limiter):
        rules = rules_for(record, model="m")
        first = await limiter.admit("req_1", rules, tokens=1)
        second = await limiter.admit("req_2", rules, tokens=1)
        third = await limiter.admit("req_3", rules, tokens=1)
        await limiter.settle(first, refund=0, events=[])
        fourth = await limiter.admit("req_4", rules, tokens=1)
        return first, second, third, fourth

    results = run(scenario)
    assert [r.admitted for r in results] == [True, True, False, True]
    assert results[2].failed.meter == Meter.CONCURRENCY


def test_a_slot_whose_request_never_settled_is_reclaimed_once_the_set_is_full():
    # A gateway died mid-request: its slot stays until SLOT_LEASE_MS, then makes room.
    record = key(key_limits=Limits(max_concurrent_requests=2))
    (rule,) = [r for r in rules_for(record, model="m") if r.meter == Meter.CONCURRENCY]
    sync_redis().zadd(rule.key, {"req_dead": 1})  # its lease ran out long ago
    sync_redis().zadd(rule.key, {"req_live": 2**50})

    results = admit_many(record, 2, tokens=1)
    assert [r.admitted for r in results] == [True, False]
    assert sync_redis().zscore(rule.key, "req_dead") is None


def test_a_quota_counter_expires_after_its_period():
    record = key(quotas=(Quota(scope="key", period="hour", model="", tokens=1000),))
    (rule,) = [r for r in rules_for(record, model="m") if r.meter == Meter.QUOTA]
    admit_many(record, 2, tokens=10)
    assert sync_redis().get(rule.key) == b"20"
    # The period's end plus a day's grace, set on the first write and kept by the next.
    assert 86_400_000 < sync_redis().pttl(rule.key) <= rule.param


def test_settle_refunds_tokens_and_appends_the_usage_event():
    record = key(
        tenant_limits=Limits(tokens_per_minute=1000),
        quotas=(Quota(scope="tenant", period="day", model="", tokens=5000),),
    )

    async def scenario(limiter):
        rules = rules_for(record, model="m")
        admitted = await limiter.admit("req_a", rules, tokens=400)
        await limiter.settle(
            admitted,
            refund=400 - 120,
            events=[(USAGE.key(), b'{"request_id": "req_a"}')],
        )
        after = await limiter.admit("req_b", rules_for(record, model="m"), tokens=10)
        return after

    after = run(scenario)
    state = dict(zip([r.meter for r in after.rules], after.remaining, strict=True))
    # 120 used + 10 reserved now; refill over the few ms elapsed adds at most a token.
    assert 869 <= state[Meter.TOKENS][0] <= 871
    assert state[Meter.QUOTA][0] == 5000 - 120 - 10
    events = sync_redis().xrange(USAGE.key())
    assert [e[1][streams.FIELD] for e in events] == [b'{"request_id": "req_a"}']


def test_quota_exhaustion_says_when_it_renews():
    record = key(quotas=(Quota(scope="key", period="hour", model="", tokens=100),))

    async def scenario(limiter):
        await limiter.admit("req_1", rules_for(record, model="m"), tokens=80)
        return await limiter.admit("req_2", rules_for(record, model="m"), tokens=30)

    refused = run(scenario)
    assert refused.failed.meter == Meter.QUOTA
    assert 0 < refused.retry_after_ms <= (3600 + 86400) * 1000


def test_model_specific_quotas_apply_to_that_model_only():
    record = key(quotas=(Quota(scope="tenant", period="day", model="big", tokens=50),))
    assert [r.admitted for r in admit_many(record, 2, tokens=40, model="small")] == [True, True]
    assert [r.admitted for r in admit_many(record, 2, tokens=40, model="big")] == [True, False]


def test_a_signature_is_accepted_once():
    record = key()

    async def scenario(limiter):
        first = await limiter.admit("req_1", rules_for(record, model="m", nonce="abc"), tokens=1)
        again = await limiter.admit("req_2", rules_for(record, model="m", nonce="abc"), tokens=1)
        other = await limiter.admit("req_3", rules_for(record, model="m", nonce="def"), tokens=1)
        return first, again, other

    first, again, other = run(scenario)
    assert first.admitted and other.admitted
    assert not again.admitted and again.failed.meter == Meter.NONCE


def test_a_signed_requests_spec_is_the_cached_rules_plus_its_nonce():
    record = key(
        tenant_limits=Limits(requests_per_minute=5), key_limits=Limits(tokens_per_minute=100)
    )
    cached = _cached_spec.cache_info().currsize
    for nonce in ("n1", "n2", "n3"):
        rules = rules_for(record, model="m", nonce=nonce)
        for spec, row in ((_admit_spec, _admit_row), (_settle_spec, _settle_row)):
            keys, body = spec(rules)
            assert keys == [rule.key for rule in rules]
            assert orjson.loads(body) == [row(rule) for rule in rules]
    # One entry per script for the key's rules, not one per signed request.
    assert _cached_spec.cache_info().currsize == cached + 2
    _, body = _admit_spec(rules_for(key(), model="m", nonce="n4"))  # no limits: the nonce alone
    assert orjson.loads(body) == [["n", 0, 0, REPLAY_TTL_SECONDS * 1000]]


def test_no_limits_no_round_trip():
    assert admit_many(key(), 3) and all(r.admitted for r in admit_many(key(), 3))
    assert rules_for(key(), model="m") == ()


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (17, "17ms"),
        (1000, "1s"),
        (1001, "2s"),
        (59_000, "59s"),
        (360_000, "6m0s"),
        (3_723_000, "1h2m3s"),
    ],
)
def test_format_duration(ms, text):
    assert format_duration(ms) == text


def test_period_bounds_are_utc_calendar_periods():
    """One calendar for quotas (hour, day, month) and budgets (day, ISO week, month)."""
    moment = datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
    new_year = datetime(2027, 1, 1, tzinfo=UTC)
    assert period_bounds("hour", moment) == (
        "2026123123",
        datetime(2026, 12, 31, 23, tzinfo=UTC),
        new_year,
    )
    assert period_bounds("day", moment) == (
        "20261231",
        datetime(2026, 12, 31, tzinfo=UTC),
        new_year,
    )
    # 2026-12-31 is a Thursday of ISO week 53.
    assert period_bounds("week", moment) == (
        "2026W53",
        datetime(2026, 12, 28, tzinfo=UTC),
        datetime(2027, 1, 4, tzinfo=UTC),
    )
    assert period_bounds("month", moment) == ("202612", datetime(2026, 12, 1, tzinfo=UTC), new_year)
