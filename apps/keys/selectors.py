"""Reads of keys and usage."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import NamedTuple

from django.db import connections
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from apps.keys.choices import UsageStatus
from apps.keys.keycache import KeyRecord, Limits, Quota
from apps.keys.models import (
    KEY_PREFIX,
    ApiKey,
    Invitation,
    ManagementToken,
    Membership,
    RateLimits,
    Tenant,
    UsageDaily,
    UsageRecord,
)
from apps.keys.ratelimit import period_bounds, quota_key
from dmxplatform import credentials
from dmxplatform.aggregates import Percentile, percentile
from dmxplatform.redis_client import request_mget


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


# The portal keeps the tenant a user works in under this session key; the management API reads
# it for calls made with the session.
SESSION_TENANT = "dmx_tenant_id"


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


def usage_records_search(
    *,
    request_id: str = "",
    client_request_id: str = "",
    key_prefix: str = "",
    tenant: str = "",
    model: str = "",
    status: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[UsageRecord]:
    """Every tenant's usage records that match all the criteria given, newest first: the
    operator console's request search. A key is named by its public prefix, as the portal and
    the admin show it (`sk-dmx-abcd1234_…`, or only its first characters); a tenant by slug or
    name."""
    records = UsageRecord.objects.select_related("api_key", "tenant").order_by("-created_at")
    if request_id:
        records = records.filter(request_id=request_id)
    if client_request_id:
        records = records.filter(client_request_id=client_request_id)
    if key_prefix:
        # Only the id part: a pasted whole secret never reaches a query.
        key_id = key_prefix.strip().removeprefix(KEY_PREFIX).partition("_")[0].rstrip("…")
        records = records.filter(api_key__key_id__startswith=key_id)
    if tenant:
        records = records.filter(Q(tenant__slug=tenant) | Q(tenant__name__iexact=tenant))
    if model:
        records = records.filter(model=model)
    if status:
        records = records.filter(status=status)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    return records


def usage_record_find(*, request_id: str) -> UsageRecord | None:
    """One request's usage record, by the id the gateway returned (X-Request-Id)."""
    return (
        UsageRecord.objects.select_related("api_key", "tenant")
        .filter(request_id=request_id)
        .first()
    )


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
            for quota, (label, _) in zip(wanted, bounds, strict=True)
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
        for quota, (_, end), count in zip(wanted, bounds, used, strict=True)
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


# The operator console's charts: the last hour of every model's traffic, a point a minute.
USAGE_MINUTES = 60
LATENCY_PERCENTILE = 0.95
# A minute's rates are per second; a minute still running has run this long at least (a rate over
# its first milliseconds would be a spike of chance).
RUNNING_MINUTE_MIN_SECONDS = 1.0


@dataclass(frozen=True)
class ModelMinutes:
    """One model's figures per minute, aligned with MinuteSeries.minutes: rates are 0 in a
    minute without requests, the others None (nothing was measured)."""

    requests: list[int]
    requests_per_second: list[float]
    tokens_per_second: list[float]  # completion tokens
    error_rate: list[float | None]  # 0..1
    ttft_p95_ms: list[float | None]
    e2e_p95_ms: list[float | None]


@dataclass(frozen=True)
class MinuteSeries:
    minutes: list[datetime]  # the start of each minute, oldest first, the running one last
    models: dict[str, ModelMinutes]  # the models with requests in the window, by name


def usage_minute_series(
    *, now: datetime | None = None, minutes: int = USAGE_MINUTES
) -> MinuteSeries:
    """Every model's requests over the last `minutes` minutes, per minute, in one query: requests
    and completion tokens per second, the error rate (what did not end ok, as the daily rollups
    count errors) and the P95 time to first token and end-to-end latency of the requests that
    did. The running minute's rates are over the seconds it has run, so that the last point
    does not read as a drop in traffic."""
    moment = now or timezone.now()
    axis = [
        moment.replace(second=0, microsecond=0) - timedelta(minutes=back)
        for back in range(minutes - 1, -1, -1)
    ]
    index = {minute: i for i, minute in enumerate(axis)}
    seconds = [60.0] * minutes
    seconds[-1] = max((moment - axis[-1]).total_seconds(), RUNNING_MINUTE_MIN_SECONDS)
    ok = Q(status=UsageStatus.OK)
    records = UsageRecord.objects.filter(created_at__gte=axis[0], created_at__lte=moment)
    figures = {
        "requests": Count("id"),
        "errors": Count("id", filter=~ok),
        "tokens": Coalesce(Sum("completion_tokens"), 0),
    }
    postgresql = connections[records.db].vendor == "postgresql"
    if postgresql:
        figures["ttft_p95"] = Percentile(
            "time_to_first_token_ms", fraction=LATENCY_PERCENTILE, filter=ok
        )
        figures["e2e_p95"] = Percentile("duration_ms", fraction=LATENCY_PERCENTILE, filter=ok)
    rows = list(
        records.annotate(minute=TruncMinute("created_at"))
        .values("model", "minute")
        .annotate(**figures)
        .order_by()
    )
    if not postgresql:
        _percentiles_in_python(records.filter(ok), rows)
    models: dict[str, ModelMinutes] = {}
    for row in rows:
        series = models.get(row["model"])
        if series is None:
            series = models[row["model"]] = ModelMinutes(
                requests=[0] * minutes,
                requests_per_second=[0.0] * minutes,
                tokens_per_second=[0.0] * minutes,
                error_rate=[None] * minutes,
                ttft_p95_ms=[None] * minutes,
                e2e_p95_ms=[None] * minutes,
            )
        i = index[row["minute"]]
        series.requests[i] = row["requests"]
        series.requests_per_second[i] = row["requests"] / seconds[i]
        series.tokens_per_second[i] = row["tokens"] / seconds[i]
        series.error_rate[i] = row["errors"] / row["requests"]
        series.ttft_p95_ms[i] = row["ttft_p95"]
        series.e2e_p95_ms[i] = row["e2e_p95"]
    return MinuteSeries(minutes=axis, models=dict(sorted(models.items())))


def _percentiles_in_python(ok: QuerySet[UsageRecord], rows: list[dict]) -> None:
    """Add the P95s to `rows` where the database has no percentile_cont (SQLite, on a laptop
    without PostgreSQL: its hour of requests fits in memory)."""
    samples: defaultdict[tuple[str, datetime], tuple[list[float], list[float]]] = defaultdict(
        lambda: ([], [])
    )
    for model, minute, ttft, duration in ok.annotate(minute=TruncMinute("created_at")).values_list(
        "model", "minute", "time_to_first_token_ms", "duration_ms"
    ):
        ttfts, durations = samples[model, minute]
        if ttft is not None:
            ttfts.append(ttft)
        durations.append(duration)
    for row in rows:
        ttfts, durations = samples.get((row["model"], row["minute"]), ([], []))
        row["ttft_p95"] = percentile(ttfts, fraction=LATENCY_PERCENTILE)
        row["e2e_p95"] = percentile(durations, fraction=LATENCY_PERCENTILE)
