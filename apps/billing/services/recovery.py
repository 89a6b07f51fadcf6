"""Putting billing's Redis counters back after the request store lost them (the keys app's
`manage.py billing_rebuild_counters` sums the spend from the usage records, which billing does
not read)."""

from __future__ import annotations

from django.db import transaction

from apps.billing.choices import BillingMode
from apps.billing.counters import balance_key, spend_key
from apps.billing.models import BillingAccount
from dmxplatform.redis_client import request_redis

# Add the spend from before the loss to a budget's counter once: the marker (in the counter's
# slot, expiring with it) says it was added, so a second run adds nothing.
_RESTORE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then
  redis.call('INCRBY', KEYS[1], ARGV[1])
  if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
end
return 0
"""


def _restored_key(counter: str) -> str:
    return f"{counter}:restored"


def spend_restored(*, tenant_id: int, budget_id: int, label: str) -> bool:
    """Whether spend_restore added to this counter already."""
    counter = spend_key(tenant_id, budget_id, label)
    return bool(request_redis().exists(_restored_key(counter)))


def spend_restore(*, tenant_id: int, budget_id: int, label: str, micros: int, ttl_ms: int) -> bool:
    """Add `micros`, the spend of period `label` the counter lost, to a budget's counter, once;
    False where it was added before. `ttl_ms`: as admission sets it, the period's end and grace."""
    counter = spend_key(tenant_id, budget_id, label)
    return bool(request_redis().eval(_RESTORE, 2, counter, _restored_key(counter), micros, ttl_ms))


def balance_copies_drop() -> int:
    """Forget Redis's copy of every prepaid balance, each under its account's lock (the one
    credits and seeding take), so the next request seeds it from the database again; returns
    how many were held."""
    dropped = 0
    tenant_ids = BillingAccount.objects.filter(mode=BillingMode.PREPAID).values_list(
        "tenant_id", flat=True
    )
    for tenant_id in tenant_ids.order_by("tenant_id"):
        with transaction.atomic():
            BillingAccount.objects.select_for_update().filter(tenant_id=tenant_id).first()
            dropped += request_redis().delete(balance_key(tenant_id))
    return dropped
