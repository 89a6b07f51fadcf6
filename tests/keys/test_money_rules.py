"""Budgets and prepaid balances in the admit and settle scripts, against real Redis: the
reservation is the worst-case cost, settle gives back the difference, the balance never goes
below zero and a budget is never passed, whatever the concurrency."""

import asyncio

import pytest

from apps.billing.counters import balance_key
from apps.keys.admission import BALANCE_NOT_HELD, admit
from apps.keys.gate import KeyGate, UsageEvent, UsageStatus
from apps.keys.keycache import BudgetLimit, Limits, Quota
from apps.keys.leases import LeaseBook
from apps.keys.limiter import Limiter
from apps.keys.ratelimit import Meter, rules_for
from dmxplatform.errors import RateLimitError
from dmxplatform.redis_client import resp_client, sync_redis
from dmxplatform.spool import Spool
from tests.keys.factories import make_key_record, run_with_redis

pytestmark = pytest.mark.usefixtures("private_redis")

MONTH_BUDGET = BudgetLimit(id=7, scope="tenant", period="month", micros=1_000_000)


async def admit_money(limiter, record, request_id: str, money: int, *, seed=None):
    """admit() as the gateway calls it, for one token and `money` micro-units."""
    return await admit(
        limiter,
        request_id=request_id,
        key=record,
        model="m",
        reserve=1,
        money=money,
        nonce=None,
        seed=seed,
    )


def spent(record) -> int:
    rule = next(r for r in rules_for(record, model="m") if r.meter == Meter.BUDGET)
    return int(sync_redis().get(rule.key) or 0)


def test_a_hard_budget_admits_exactly_what_it_holds_at_the_worst_case_under_concurrency():
    record = make_key_record(budgets=(MONTH_BUDGET,))
    # Each request may cost up to 0.030001 (a worst case that does not divide the budget):
    # 33 of them fit in 1.000000, the 34th would pass it.
    worst = 30_001

    async def scenario(limiter):
        rules = rules_for(record, model="m")
        return await asyncio.gather(
            *(limiter.admit(f"req_{i}", rules, tokens=1, money=worst) for i in range(64))
        )

    results = run_with_redis(lambda redis: scenario(Limiter(redis)))
    admitted = [r for r in results if r.admitted]
    assert len(admitted) == 1_000_000 // worst == 33
    assert all(r.failed.meter == Meter.BUDGET for r in results if not r.admitted)
    assert spent(record) == 33 * worst
    # It turned requests away before being spent to the last unit: the alert's "reached" flag.
    rule = next(r for r in rules_for(record, model="m") if r.meter == Meter.BUDGET)
    assert sync_redis().exists(rule.key + ":refused")
    assert 0 < sync_redis().pttl(rule.key + ":refused") <= rule.param


def test_a_budget_that_admits_sets_no_refused_flag():
    record = make_key_record(budgets=(MONTH_BUDGET,))

    async def scenario(limiter):
        return await limiter.admit("req_1", rules_for(record, model="m"), tokens=1, money=10)

    assert run_with_redis(lambda redis: scenario(Limiter(redis))).admitted
    rule = next(r for r in rules_for(record, model="m") if r.meter == Meter.BUDGET)
    assert not sync_redis().exists(rule.key + ":refused")


def test_settle_gives_back_what_the_request_did_not_cost():
    record = make_key_record(budgets=(MONTH_BUDGET,))

    async def scenario(limiter):
        admission = await limiter.admit("req_1", rules_for(record, model="m"), tokens=1, money=500)
        await limiter.settle(admission, refund=0, events=[], money=500 - 123)
        return admission

    assert run_with_redis(lambda redis: scenario(Limiter(redis))).admitted
    assert spent(record) == 123


@pytest.mark.parametrize("once", [True, False], ids=["batch-line", "request"])
def test_a_try_that_runs_again_under_its_request_id_is_counted_once(tmp_path, once):
    """A batch worker lost after a line's settle call and before it kept the answer runs the
    line again under the same request id. The ledger keeps the first try's record only, so the
    quota, budget and prepaid balance must count that try alone; another id counts again."""
    record = make_key_record(
        budgets=(MONTH_BUDGET,),
        quotas=(Quota(scope="key", period="day", model="", tokens=10_000),),
        prepaid=True,
    )
    sync_redis().set(balance_key(record.tenant_id), 1_000_000)

    async def attempt(gate, request_id: str, used: int, cost: int) -> None:
        def usage(ended_by):
            event = UsageEvent(
                request_id=request_id,
                api_key_id=record.id,
                tenant_id=record.tenant_id,
                created_at=0.0,
                endpoint="chat.completions",
                model="m",
                status=UsageStatus.OK,
                http_status=200,
                prompt_tokens=used,
                cost_micros=cost,
            )
            return event, ()

        lease = gate.lease(record, request_id=request_id, usage=usage, once=once)
        async with lease:
            await lease.admit(model="m", reserve=400, money=5_000, nonce=None)

    async def scenario(redis):
        gate = KeyGate(resp_client(), redis, spool=Spool(tmp_path))
        await attempt(gate, "req_line", used=120, cost=1_200)
        await attempt(gate, "req_line", used=150, cost=1_500)  # the lost worker's line again
        await attempt(gate, "req_other", used=30, cost=300)

    run_with_redis(scenario)
    quota = next(r for r in rules_for(record, model="m") if r.meter == Meter.QUOTA)
    counted = [(120, 1_200), (30, 300)] if once else [(120, 1_200), (150, 1_500), (30, 300)]
    assert int(sync_redis().get(quota.key)) == sum(tokens for tokens, _ in counted)
    assert spent(record) == sum(cost for _, cost in counted)
    assert int(sync_redis().get(balance_key(record.tenant_id))) == 1_000_000 - spent(record)


def test_a_soft_budget_counts_and_never_refuses():
    record = make_key_record(
        budgets=(BudgetLimit(id=8, scope="tenant", period="day", micros=100, hard=False),)
    )

    async def scenario(limiter):
        rules = rules_for(record, model="m")
        return [await limiter.admit(f"req_{i}", rules, tokens=1, money=60) for i in range(3)]

    assert all(r.admitted for r in run_with_redis(lambda redis: scenario(Limiter(redis))))
    assert spent(record) == 180


def test_a_prepaid_balance_not_held_asks_to_be_seeded_and_never_goes_below_zero():
    record = make_key_record(prepaid=True)
    key = balance_key(record.tenant_id)

    async def scenario(limiter):
        rules = rules_for(record, model="m")
        first = await limiter.admit("req_0", rules, tokens=1, money=10)
        sync_redis().set(key, 1_000)
        results = await asyncio.gather(
            *(limiter.admit(f"req_{i}", rules, tokens=1, money=70) for i in range(1, 65))
        )
        return first, results

    first, results = run_with_redis(lambda redis: scenario(Limiter(redis)))
    assert not first.admitted and first.retry_after_ms == BALANCE_NOT_HELD
    assert sum(r.admitted for r in results) == 1_000 // 70 == 14
    assert int(sync_redis().get(key)) == 1_000 - 14 * 70 >= 0


def test_admission_seeds_the_balance_once_and_refuses_when_it_cannot_cover_the_request():
    record = make_key_record(prepaid=True)
    seeded = []

    async def seed(tenant_id):
        seeded.append(tenant_id)
        sync_redis().set(balance_key(tenant_id), 50, nx=True)
        return 50

    async def scenario(limiter):
        ok = await admit_money(limiter, record, "r1", 40, seed=seed)
        with pytest.raises(RateLimitError) as refused:
            await admit_money(limiter, record, "r2", 40, seed=seed)
        return ok, refused.value

    ok, refused = run_with_redis(lambda redis: scenario(Limiter(redis)))
    assert ok.admitted and seeded == [record.tenant_id]
    assert refused.status == 429 and refused.code == "insufficient_balance"
    assert "0.000040" in refused.message


def test_a_budget_refusal_names_the_budget_and_when_it_resets():
    record = make_key_record(budgets=(BudgetLimit(id=9, scope="key", period="week", micros=10),))

    async def scenario(limiter):
        async def one(request_id):
            return await admit_money(limiter, record, request_id, 6, seed=None)

        await one("r1")
        with pytest.raises(RateLimitError) as refused:
            await one("r2")
        return refused.value

    refused = run_with_redis(lambda redis: scenario(Limiter(redis)))
    assert refused.code == "insufficient_quota" and refused.error_type == "insufficient_quota"
    assert "this key's weekly budget of 0.000010 USD" in refused.message
    assert "may cost up to 0.000006 USD" in refused.message
    assert 0 < int(refused.headers["Retry-After"]) <= 8 * 86400


def test_rule_sets_with_money_are_never_leased():
    book = LeaseBook(requests=32, ttl=5.0)
    limits = Limits(requests_per_minute=1000)
    money = rules_for(make_key_record(tenant_limits=limits, budgets=(MONTH_BUDGET,)), model="m")
    plain = rules_for(make_key_record(tenant_limits=limits), model="m")
    for _ in range(3):
        assert book.ask(money) == (0, "")
    book.ask(plain)
    assert book.ask(plain)[0] == 32


def test_each_tenant_has_its_own_balance_and_spend_counters(settings):
    settings.DMX_REQUEST_REDIS_SHARDS = 1  # every tenant in one slot: the names must differ
    assert balance_key(1) != balance_key(2)
    one = rules_for(make_key_record(tenant_id=1, prepaid=True, budgets=(MONTH_BUDGET,)), model="m")
    two = rules_for(make_key_record(tenant_id=2, prepaid=True, budgets=(MONTH_BUDGET,)), model="m")
    assert not {rule.key for rule in one} & {rule.key for rule in two}


def test_a_request_that_costs_more_than_the_whole_budget_never_fits_and_flags_nothing():
    record = make_key_record(budgets=(BudgetLimit(id=5, scope="tenant", period="day", micros=10),))

    async def scenario(limiter):
        with pytest.raises(RateLimitError) as refused:
            await admit_money(limiter, record, "r1", 11, seed=None)
        return refused.value

    refused = run_with_redis(lambda redis: scenario(Limiter(redis)))
    assert "more than your whole daily budget of 0.000010 USD" in refused.message
    assert refused.headers["Retry-After"] == "60"
    rule = next(r for r in rules_for(record, model="m") if r.meter == Meter.BUDGET)
    assert not sync_redis().exists(rule.key + ":refused")  # not "reached": nothing was spent


def test_a_cost_above_its_hold_takes_the_balance_to_zero_never_below():
    record = make_key_record(prepaid=True)
    sync_redis().set(balance_key(record.tenant_id), 100)

    async def scenario(limiter):
        admission = await limiter.admit("req_1", rules_for(record, model="m"), tokens=1, money=80)
        # It cost 150 (a prompt the gateway could only estimate): 70 more than held.
        await limiter.settle(admission, refund=0, events=[], money=80 - 150)

    run_with_redis(lambda redis: scenario(Limiter(redis)))
    assert int(sync_redis().get(balance_key(record.tenant_id))) == 0


def test_the_balance_refusal_says_when_to_try_again():
    record = make_key_record(prepaid=True)
    sync_redis().set(balance_key(record.tenant_id), 5)

    async def scenario(limiter):
        with pytest.raises(RateLimitError) as refused:
            await admit_money(limiter, record, "r1", 6, seed=None)
        return refused.value

    assert int(run_with_redis(lambda redis: scenario(Limiter(redis))).headers["Retry-After"]) > 0
