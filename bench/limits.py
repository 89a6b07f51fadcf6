"""Redis time per request for the admission and settle scripts, with the benchmark key's rules.

    .venv/bin/python bench/limits.py [--requests 3000]

The key bench/run.py uses has a plan and key limits on requests, tokens and concurrency and a
quota on each: eight rules. Each request is admitted, then settled with a usage event of a
typical size, as the gateway does; the time is Redis's own (INFO commandstats), so the figure
is what one Redis core spends per request, whatever the client and the network add. It runs
twice: every admission in Redis, then with admission leases (apps/keys/leases.py) as a busy key
gets them, the grants and the final give-back counted as admission time. Then a third time with
money on as well (bench/run.py --billing's key B): the same rules plus a tenant budget, a key
budget and a prepaid balance, eleven rules, each request reserving its worst-case cost and
settling its real one; such a rule set is never leased, so every admission goes to Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.setup_platform import MODEL, UNREACHABLE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")
os.environ.setdefault("DMX_DEBUG", "1")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
os.environ.setdefault("DMX_KEY_PEPPER", "bench-pepper")
os.environ.setdefault("DMX_REDIS_PREFIX", "dmxbench-limits")

USAGE_EVENT = b"x" * 640  # a usage record as the gateway encodes it is about this size
# Money per request in micro-units: the worst case held at admission and what settle gives back
# of it (their size does not change Redis's work).
MONEY = 100
MONEY_REFUND = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--redis-db", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("REDIS_URL", f"redis://127.0.0.1:6379/{args.redis_db}")

    import django

    django.setup()
    from apps.billing.counters import balance_key
    from apps.keys.keycache import BudgetLimit, Limits, Quota
    from apps.keys.leases import LeaseBook
    from apps.keys.limiter import Limiter
    from apps.keys.ratelimit import rules_for
    from dmxplatform.redis_client import resp_client, rkey, sync_redis
    from tests.keys.factories import make_key_record

    limits = Limits(
        requests_per_minute=UNREACHABLE,
        tokens_per_minute=UNREACHABLE,
        max_concurrent_requests=UNREACHABLE,
    )
    record = make_key_record(
        tenant_limits=limits,
        key_limits=limits,
        quotas=(
            Quota(scope="tenant", period="month", model="", tokens=UNREACHABLE),
            Quota(scope="key", period="day", model="", tokens=UNREACHABLE),
        ),
    )
    with_money = make_key_record(
        tenant_limits=limits,
        key_limits=limits,
        quotas=record.quotas,
        budgets=(
            BudgetLimit(id=1, scope="tenant", period="month", micros=UNREACHABLE * 10**6),
            BudgetLimit(id=2, scope="key", period="day", micros=UNREACHABLE * 10**6),
        ),
        prepaid=True,
    )
    events = [(rkey("bench", "usage"), USAGE_EVENT)]
    redis = sync_redis()

    def redis_usec() -> int:
        stats = redis.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in ("eval", "evalsha"))

    async def run(rules, leases: LeaseBook | None, money: int) -> tuple[int, int]:
        # The gateway's own client and scripts; INFO is read between calls, outside their time.
        client = resp_client()
        limiter = Limiter(client, leases)
        admit_usec = settle_usec = 0
        refund = MONEY_REFUND if money else 0
        try:
            for i in range(args.requests):
                before = redis_usec()
                admission = await limiter.admit(f"req_{i}", rules, tokens=300, money=money)
                assert admission.admitted, admission
                middle = redis_usec()
                await limiter.settle(admission, refund=20, events=events, money=refund)
                admit_usec += middle - before
                settle_usec += redis_usec() - middle
            before = redis_usec()
            await limiter.end_leases(everything=True)  # a lease's give-back is admission's cost
            admit_usec += redis_usec() - before
        finally:
            await client.close()
        return admit_usec, settle_usec

    for name, key, leases, money in (
        ("every admission in Redis", record, None, 0),
        ("leases of 16 requests", record, LeaseBook(requests=16, ttl=60.0), 0),
        (
            "with money (2 budgets, a balance; leases on, never taken)",
            with_money,
            LeaseBook(requests=16, ttl=60.0),
            MONEY,
        ),
    ):
        rules = rules_for(key, model=MODEL)
        if key.prepaid:  # the balance as the gateway seeds it from the database
            redis.set(balance_key(key.tenant_id), UNREACHABLE * 10**6)
        try:
            admit_usec, settle_usec = asyncio.run(run(rules, leases, money))
        finally:
            for stored in redis.scan_iter(rkey("*")):
                redis.delete(stored)
        print(
            f"{len(rules)} rules, {args.requests} requests, {name}: Redis time per admit "
            f"{admit_usec / args.requests:.1f} µs, per settle {settle_usec / args.requests:.1f} µs"
        )


if __name__ == "__main__":
    main()
