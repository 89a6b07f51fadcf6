"""Reads of API keys: the record the gateway checks, and a tenant's keys as people see them."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet

from apps.billing.choices import BillingMode
from apps.billing.money import MULTIPLIER_SCALE, multiplier_units, to_micros
from apps.billing.selectors import key_usage_columns
from apps.keys.keycache import BudgetLimit, KeyRecord, Limits, Quota
from apps.keys.models import ApiKey, RateLimits, Tenant


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
    account = getattr(key.tenant, "billing_account", None)
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
        plan=plan.name if plan else "",
        price_multiplier=multiplier_units(plan.price_multiplier) if plan else MULTIPLIER_SCALE,
        budgets=tuple(
            BudgetLimit(
                id=budget.id,
                scope="key" if budget.api_key_id else "tenant",
                period=budget.period,
                micros=to_micros(budget.amount),
                hard=budget.hard,
            )
            for budget in key.tenant.budgets.all()
            if budget.api_key_id in (None, key.id)
        ),
        prepaid=account is not None and account.mode == BillingMode.PREPAID,
    )


def _record_rows() -> QuerySet[ApiKey]:
    """Keys with everything their records read, in a fixed number of queries however many."""
    return ApiKey.objects.select_related(
        "tenant__plan", "tenant__billing_account"
    ).prefetch_related("tenant__plan__quotas", "tenant__budgets")


def key_record_load(key_id: str) -> KeyRecord | None:
    """Return a key's record from the database, or None when the id is unknown."""
    key = _record_rows().filter(key_id=key_id).first()
    return key_record_from_row(key) if key else None


def key_records_of_tenants(*, tenant_ids: list[int]) -> list[KeyRecord]:
    """The records of every key of these tenants (revoked ones too: a gateway must learn it)."""
    return [key_record_from_row(key) for key in _record_rows().filter(tenant_id__in=tenant_ids)]


def api_keys_of(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """A tenant's keys with when each was last used and its tokens this calendar month (UTC),
    from billing's usage ledger: the hot path writes nothing to the database for either."""
    usage = key_usage_columns(key=OuterRef("pk"))
    return (
        ApiKey.objects.filter(tenant=tenant)
        .select_related("tenant__plan")
        .annotate(last_used_at=usage.last_used_at, month_tokens=usage.month_tokens)
    )
