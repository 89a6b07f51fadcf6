"""Reads of token quotas and where each one's period stands."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.utils import timezone

from apps.billing.counters import period_bounds
from apps.keys.models import ApiKey, Tenant
from apps.keys.ratelimit import quota_key
from dmxplatform.redis_client import request_mget


@dataclass(frozen=True)
class QuotaStatus:
    """A token quota and where its period stands, as admission counts it (in-flight
    reservations included, so `remaining` is what a new request can still get)."""

    scope: str  # "tenant" or "key"
    key_id: str  # the key's public id for a key quota; "" for the tenant's
    period: str
    model: str  # "" for all models
    limit: int
    used: int
    resets_at: datetime

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


class _Wanted(NamedTuple):
    """A quota quota_status reads."""

    tenant_id: int
    scope: str
    key_id: str  # as in QuotaStatus
    owner: int  # the tenant's or the key's id
    period: str
    model: str
    limit: int


def _plan_quotas(tenant: Tenant) -> list[_Wanted]:
    if tenant.plan is None:
        return []
    return [
        _Wanted(tenant.id, "tenant", "", tenant.id, quota.period, quota.model, quota.tokens)
        for quota in tenant.plan.quotas.all()
    ]


def _key_quota(key: ApiKey) -> _Wanted:
    return _Wanted(
        key.tenant_id, "key", key.key_id, key.id, key.token_quota_period, "", key.token_quota
    )


def _quotas_used(wanted: list[_Wanted], moment: datetime) -> list[QuotaStatus]:
    """The quotas with what each has used this period (one MGET per request-store slot)."""
    if not wanted:
        return []
    bounds = [period_bounds(quota.period, moment) for quota in wanted]
    used = request_mget(
        [
            quota_key(quota.tenant_id, quota.scope, quota.owner, label, quota.model)
            for quota, (label, _, _) in zip(wanted, bounds, strict=True)
        ]
    )
    return [
        QuotaStatus(
            scope=quota.scope,
            key_id=quota.key_id,
            period=quota.period,
            model=quota.model,
            limit=quota.limit,
            used=int(count or 0),
            resets_at=end,
        )
        for quota, (_, _, end), count in zip(wanted, bounds, used, strict=True)
    ]


def quota_status(*, tenant: Tenant, now: datetime | None = None) -> list[QuotaStatus]:
    """Every quota of a tenant's plan and of its live keys, with what is used this period."""
    keys = ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True, token_quota__isnull=False)
    wanted = _plan_quotas(tenant) + [_key_quota(key) for key in keys]
    return _quotas_used(wanted, now or timezone.now())


def quota_status_all(*, now: datetime | None = None) -> list[tuple[str, QuotaStatus]]:
    """Every tenant's quotas as quota_status gives them, each with its tenant's slug: for
    /metrics, in three queries and one MGET however many tenants there are."""
    owners: list[str] = []
    wanted: list[_Wanted] = []
    for tenant in Tenant.objects.select_related("plan").prefetch_related("plan__quotas"):
        for quota in _plan_quotas(tenant):
            owners.append(tenant.slug)
            wanted.append(quota)
    keys = ApiKey.objects.filter(revoked_at__isnull=True, token_quota__isnull=False)
    for key in keys.select_related("tenant"):
        owners.append(key.tenant.slug)
        wanted.append(_key_quota(key))
    return list(zip(owners, _quotas_used(wanted, now or timezone.now()), strict=True))
