"""The keys app's reads: its door for the rest of the platform, which imports from here only.

One module per subdomain:
    api_keys  the record the gateway checks for a key; a tenant's keys as people see them
    tenancy   memberships and the tenant a session works in, members, invitations, tokens
    usage     usage records and their search, daily rollups and series, the per-minute series
    quotas    token quotas and where each one's period stands
    statements  a tenant's monthly statement: usage and cost per model, balance movements
"""

from apps.keys.selectors.api_keys import api_keys_of, key_record_load
from apps.keys.selectors.quotas import QuotaStatus, quota_status, quota_status_all
from apps.keys.selectors.statements import Statement, StatementLine, month_bounds, statement_of
from apps.keys.selectors.tenancy import (
    SESSION_TENANT,
    invitation_find,
    management_tokens_of,
    membership_find,
    memberships_of,
    tenant_invitations_open,
    tenant_members,
)
from apps.keys.selectors.usage import (
    LATENCY_PERCENTILE,
    RUNNING_MINUTE_MIN_SECONDS,
    USAGE_MINUTES,
    DailySeries,
    MinuteSeries,
    ModelMinutes,
    usage_by_key,
    usage_daily_of,
    usage_daily_series,
    usage_minute_series,
    usage_record_find,
    usage_records_of,
    usage_records_search,
)

__all__ = [
    "LATENCY_PERCENTILE",
    "RUNNING_MINUTE_MIN_SECONDS",
    "SESSION_TENANT",
    "USAGE_MINUTES",
    "DailySeries",
    "MinuteSeries",
    "ModelMinutes",
    "QuotaStatus",
    "Statement",
    "StatementLine",
    "api_keys_of",
    "invitation_find",
    "key_record_load",
    "management_tokens_of",
    "membership_find",
    "memberships_of",
    "month_bounds",
    "quota_status",
    "quota_status_all",
    "statement_of",
    "tenant_invitations_open",
    "tenant_members",
    "usage_by_key",
    "usage_daily_of",
    "usage_daily_series",
    "usage_minute_series",
    "usage_record_find",
    "usage_records_of",
    "usage_records_search",
]
