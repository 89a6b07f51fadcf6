"""The keys app's reads: its door for the rest of the platform, which imports from here only.

One module per subdomain:
    api_keys  the record the gateway checks for a key; a tenant's keys as people see them
    tenancy   memberships and the tenant a session works in, members, invitations, tokens
    quotas    token quotas and where each one's period stands
"""

from apps.keys.selectors.api_keys import api_keys_of, key_record_load
from apps.keys.selectors.quotas import QuotaStatus, quota_status, quota_status_all
from apps.keys.selectors.tenancy import (
    SESSION_TENANT,
    invitation_find,
    management_tokens_of,
    membership_find,
    memberships_of,
    tenant_invitations_open,
    tenant_members,
)

__all__ = [
    "SESSION_TENANT",
    "QuotaStatus",
    "api_keys_of",
    "invitation_find",
    "key_record_load",
    "management_tokens_of",
    "membership_find",
    "memberships_of",
    "quota_status",
    "quota_status_all",
    "tenant_invitations_open",
    "tenant_members",
]
