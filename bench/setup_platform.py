"""Prepare the benchmark's platform: a keyed tenant with every limit on, the models (priced), a
node token and 10,000 sensitive terms; and a second tenant with the same limits whose money is
checked on every request too (`bench/run.py --billing`): prepaid with a balance, a hard monthly
budget for the tenant and a hard daily one for its key, none of them ever reached. Prints the
two keys and the node token as JSON.

`--workload FILE` also creates the realistic workload's keys (bench/workload.py's KeyPlan: a
thousand keys in two hundred tenants, some near their limits, some signing, a share of tenants
prepaid) and an embedding model, and writes the keys' secrets and signing secrets to FILE.

Run by bench/run.py with the benchmark's own database and Redis (see its environment).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")

MODEL = "bench-model"
# The same upstream under a million-token context: prompts of megabytes fit it and are counted.
LONG_MODEL = "bench-long"
LONG_CONTEXT = 1 << 20
EMBED_MODEL = "bench-embed"
EMBED_CONTEXT = 8192
TERMS = 10_000
# Limits so high that the benchmark never reaches them: they are checked on every request,
# which is the cost being measured, but never refuse one.
UNREACHABLE = 10**9
# Money the same way: a balance and budgets that a benchmark's requests (a few hundred
# micro-units each at the bench models' prices) never exhaust.
UNREACHABLE_MONEY = Decimal(10**6)


def bench_terms(count: int) -> list[str]:
    """Half English-like words, half three-character Chinese terms; none is the upstream's text."""
    rng = random.Random(1)
    words = {
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(6, 10)))
        for _ in range(count // 2)
    }
    while len(words) < count:
        words.add("".join(chr(rng.randint(0x4E00, 0x62FF)) for _ in range(3)))
    return sorted(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, help="also the realistic workload's keys")
    args = parser.parse_args()
    import django

    django.setup()
    from apps.billing.choices import BillingMode
    from apps.billing.services import account_of, account_update, budget_set, price_set, top_up
    from apps.gateway.models import SensitiveTerm
    from apps.gateway.services import sensitive_term_import
    from apps.hardware.services import node_token_create
    from apps.keys.models import Plan, PlanQuota, Tenant
    from apps.keys.services import api_key_create, tenant_create
    from apps.models.choices import ModelKind
    from apps.models.models import LlmModel
    from apps.models.services import llm_model_create, model_version_create
    from dmxplatform.redis_client import sync_redis

    sync_redis().flushdb()
    models = (
        (MODEL, 2048, ModelKind.GENERATE),
        (LONG_MODEL, LONG_CONTEXT, ModelKind.GENERATE),
        (EMBED_MODEL, EMBED_CONTEXT, ModelKind.EMBED),
    )
    for name, context, kind in models:
        if not LlmModel.objects.filter(name=name).exists():
            model = llm_model_create(name=name, max_context_tokens=context, kind=kind)
            version = model_version_create(model=model, tag="v1")
            price_set(
                model_version_id=version.id,
                input_per_million=Decimal("0.15"),
                output_per_million=Decimal("0.60"),
            )
    plan, _ = Plan.objects.get_or_create(
        name="bench",
        defaults={
            "requests_per_minute": UNREACHABLE,
            "tokens_per_minute": UNREACHABLE,
            "max_concurrent_requests": UNREACHABLE,
        },
    )
    PlanQuota.objects.get_or_create(
        plan=plan, period="month", model="", defaults={"tokens": UNREACHABLE}
    )

    def bench_key(slug: str, name: str, *, requests_per_minute: int = UNREACHABLE):
        tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(name=name, slug=slug)
        if tenant.plan_id != plan.id:
            tenant.plan = plan
            tenant.save()
        return api_key_create(
            tenant=tenant,
            name="bench",
            requests_per_minute=requests_per_minute,
            tokens_per_minute=UNREACHABLE,
            max_concurrent_requests=UNREACHABLE,
            token_quota=UNREACHABLE,
            token_quota_period="day",
        )

    def prepaid(tenant_id: int) -> None:
        account_update(account=account_of(tenant_id), mode=BillingMode.PREPAID)
        top_up(tenant_id=tenant_id, amount=UNREACHABLE_MONEY, actor="bench", key="bench")  # once
        budget_set(tenant_id=tenant_id, period="month", amount=UNREACHABLE_MONEY, hard=True)

    _, key = bench_key("bench", "Bench")  # postpaid, no budget: no money rule
    billing_key, billing_secret = bench_key("bench-billing", "Bench billing")
    tenant_id = billing_key.tenant_id
    prepaid(tenant_id)
    budget_set(
        tenant_id=tenant_id,
        api_key_id=billing_key.id,
        period="day",
        amount=UNREACHABLE_MONEY,
        hard=True,
    )
    _, token = node_token_create(name="bench")
    if SensitiveTerm.objects.count() < TERMS:
        sensitive_term_import(terms=bench_terms(TERMS), category="bench", action="block")
    if args.workload:
        args.workload.write_text(json.dumps(workload_keys(bench_key, prepaid)))
    print(json.dumps({"key": key, "token": token, "billing_key": billing_secret}))


def workload_keys(bench_key, prepaid) -> dict:
    """The workload's keys by index (bench/workload.py's KeyPlan) and the signing keys'
    secrets."""
    from apps.keys.services import api_key_signing_enable
    from bench.workload import NEAR_LIMIT_RPM, KeyPlan

    plan = KeyPlan.draw()
    keys, signing = [], {}
    for index in range(plan.keys):
        tenant = plan.tenant_of(index)
        rpm = NEAR_LIMIT_RPM if index in plan.near_limit else UNREACHABLE
        api_key, secret = bench_key(f"load-{tenant}", f"Load {tenant}", requests_per_minute=rpm)
        if index < plan.tenants and tenant in plan.prepaid_tenants:  # once per tenant
            prepaid(api_key.tenant_id)
        if index in plan.signed:
            signing[index] = api_key_signing_enable(key=api_key)
        keys.append(secret)
    return {"keys": keys, "signing": signing}


if __name__ == "__main__":
    main()
