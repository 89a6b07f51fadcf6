"""Reads of keys and usage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.db.models import F, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.keys.keycache import KeyRecord, Limits, Quota
from apps.keys.models import (
    ApiKey,
    Invitation,
    ManagementToken,
    Membership,
    RateLimits,
    Tenant,
    UsageDaily,
    UsageRecord,
)
from apps.keys.ratelimit import period_bounds
from dmxplatform import credentials
from dmxplatform.redis_client import rkey, sync_redis


def _limits(source: RateLimits | None) -> Limits:
    if source is None:
        return Limits()
    return Limits(
        requests_per_minute=source.requests_per_minute,
        tokens_per_minute=source.tokens_per_minute,
        max_concurrent_requests=source.max_concurrent_requests,
    )


def key_record_from_row(key: ApiKey) -> KeyRecord:
    """Flatten a key, its tenant and its tenant's plan into what the gateway checks."""
    plan = key.tenant.plan
    quotas = [
        Quota(scope="tenant", period=q.period, model=q.model, tokens=q.tokens)
        for q in (plan.quotas.all() if plan else ())
    ]
    if key.token_quota:
        quotas.append(
            Quota(scope="key", period=key.token_quota_period, model="", tokens=key.token_quota)
        )
    return KeyRecord(
        id=key.id,
        key_id=key.key_id,
        secret_hash=key.secret_hash,
        tenant_id=key.tenant_id,
        name=key.name,
        allowed_models=tuple(key.allowed_models or ()),
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        revoked=key.revoked_at is not None or not key.tenant.is_active,
        allowed_networks=tuple(key.allowed_networks or ()),
        priority=key.priority,
        signing_secret_encrypted=key.signing_secret_encrypted if key.signing_required else "",
        tenant_limits=_limits(plan),
        key_limits=_limits(key),
        quotas=tuple(quotas),
        previous_secret_hash=key.previous_secret_hash,
        previous_valid_until=(
            key.previous_secret_expires_at.timestamp() if key.previous_secret_expires_at else None
        ),
    )


def key_record_load(key_id: str) -> KeyRecord | None:
    """Return a key's record from the database, or None when the id is unknown."""
    key = (
        ApiKey.objects.select_related("tenant__plan")
        .prefetch_related("tenant__plan__quotas")
        .filter(key_id=key_id)
        .first()
    )
    return key_record_from_row(key) if key else None


# --- tenants, members and what the portal and the management API show ---------------------


def memberships_of(*, user) -> QuerySet[Membership]:
    """The tenants a user belongs to, with their role, oldest first."""
    return Membership.objects.filter(user=user, tenant__is_active=True).select_related(
        "tenant__plan"
    )


def membership_find(*, user, tenant_id: int | None) -> Membership | None:
    """The user's membership of `tenant_id`, or of their first tenant when it is None or not
    theirs: the tenant the portal and the session-authenticated API act in."""
    memberships = memberships_of(user=user).order_by("created_at")
    chosen = memberships.filter(tenant_id=tenant_id).first() if tenant_id else None
    return chosen or memberships.first()


def tenant_members(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("created_at")


def tenant_invitations_open(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        tenant=tenant, accepted_at__isnull=True, expires_at__gt=timezone.now()
    )


def invitation_find(*, token: str) -> Invitation | None:
    """The invitation a token from an invitation mail names, used or not; None if unknown."""
    return (
        Invitation.objects.select_related("tenant")
        .filter(token_hash=credentials.hash_secret(token))
        .first()
    )


def api_keys_of(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """A tenant's keys with when each was last used and its tokens this calendar month (UTC),
    from the ledger: the hot path writes nothing to the database for either."""
    month_start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_used = UsageRecord.objects.filter(api_key=OuterRef("pk")).order_by("-created_at")
    month = (
        UsageDaily.objects.filter(api_key=OuterRef("pk"), day__gte=month_start.date())
        .values("api_key")
        .annotate(total=Sum(F("prompt_tokens") + F("completion_tokens")))
        .values("total")
    )
    return (
        ApiKey.objects.filter(tenant=tenant)
        .select_related("tenant__plan")
        .annotate(
            last_used_at=Subquery(last_used.values("created_at")[:1]),
            month_tokens=Coalesce(Subquery(month), 0),
        )
    )


def management_tokens_of(*, user, tenant: Tenant) -> QuerySet[ManagementToken]:
    return ManagementToken.objects.filter(user=user, tenant=tenant)


def usage_records_of(
    *,
    tenant: Tenant,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[UsageRecord]:
    """A tenant's raw usage records, newest first, in [since, until)."""
    records = UsageRecord.objects.filter(tenant=tenant)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    return records.select_related("api_key")


def usage_daily_of(*, tenant: Tenant, since: date | None = None) -> QuerySet[UsageDaily]:
    days = UsageDaily.objects.filter(tenant=tenant)
    return days.filter(day__gte=since) if since else days


@dataclass(frozen=True)
class DailySeries:
    """Requests and tokens per day (every day of the window, zeros included) and per model."""

    days: list[date]
    requests: list[int]
    tokens: list[int]
    tokens_by_model: dict[str, list[int]]


def usage_daily_series(*, tenant: Tenant, days: int = 30) -> DailySeries:
    """The last `days` UTC days of a tenant's usage, from the daily rollups."""
    today = timezone.now().date()
    window = [today - timedelta(days=n) for n in range(days - 1, -1, -1)]
    index = {day: i for i, day in enumerate(window)}
    requests, tokens = [0] * days, [0] * days
    by_model: dict[str, list[int]] = {}
    rows = (
        usage_daily_of(tenant=tenant, since=window[0])
        .values("day", "model")
        .annotate(
            requests_sum=Sum("requests"),
            tokens_sum=Sum(F("prompt_tokens") + F("completion_tokens")),
        )
    )
    for row in rows:
        i = index[row["day"]]
        requests[i] += row["requests_sum"]
        tokens[i] += row["tokens_sum"]
        by_model.setdefault(row["model"], [0] * days)[i] += row["tokens_sum"]
    return DailySeries(days=window, requests=requests, tokens=tokens, tokens_by_model=by_model)


def usage_by_key(*, tenant: Tenant, since: date) -> QuerySet:
    """Per key since a day: requests, errors and tokens, most tokens first."""
    return (
        usage_daily_of(tenant=tenant, since=since)
        .values("api_key__key_id", "api_key__name")
        .annotate(
            # First: after the two below, these names mean their sums, not the columns.
            total_tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            requests=Sum("requests"),
            errors=Sum("errors"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
        .order_by("-total_tokens")
    )


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


def quota_status(*, tenant: Tenant, now: datetime | None = None) -> list[QuotaStatus]:
    """Every quota of a tenant's plan and of its live keys, with what is used this period."""
    moment = now or timezone.now()
    wanted: list[tuple[str, str, int, str, str, int]] = []
    if tenant.plan is not None:
        for quota in tenant.plan.quotas.all():
            wanted.append(("tenant", "", tenant.id, quota.period, quota.model, quota.tokens))
    keys = ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True, token_quota__isnull=False)
    for key in keys:
        wanted.append(("key", key.key_id, key.id, key.token_quota_period, "", key.token_quota))
    if not wanted:
        return []
    bounds = [period_bounds(period, moment) for _, _, _, period, _, _ in wanted]
    used = sync_redis().mget(
        [
            rkey("quota", scope, owner, label, model or "*")
            for (scope, _, owner, _, model, _), (label, _) in zip(wanted, bounds, strict=True)
        ]
    )
    return [
        QuotaStatus(
            scope=scope,
            key_id=key_id,
            period=period,
            model=model,
            limit=limit,
            used=int(count or 0),
            resets_at=end,
        )
        for (scope, key_id, _, period, model, limit), (_, end), count in zip(
            wanted, bounds, used, strict=True
        )
    ]
