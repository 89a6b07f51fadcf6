"""The keys app's writes: its door for the rest of the platform, which imports from here only.

One module per subdomain:
    tenancy   tenants, sign-up and approval, plans; a plan's or tenant's change pushed to its keys
    api_keys  API keys: create, edit, rotate, signing, revoke, publish to every gateway
    members   a tenant's members and invitations
    tokens    management tokens and their authentication
"""

from apps.keys.services.api_keys import (
    LIMIT_NAMES,
    MAX_ROTATION_GRACE,
    api_key_create,
    api_key_publish,
    api_key_revoke,
    api_key_rotate,
    api_key_signing_enable,
    api_key_update,
)
from apps.keys.services.members import (
    INVITATION_LIFETIME,
    invitation_accept,
    invitation_withdraw,
    member_invite,
    member_remove,
    member_role_change,
)
from apps.keys.services.tenancy import (
    NEW_ACCOUNT_LIMITS,
    NEW_ACCOUNT_MONTHLY_TOKENS,
    plan_delete,
    plan_edit,
    plan_publish,
    plan_save,
    tenant_approve,
    tenant_create,
    tenant_keys_publish,
    tenant_sign_up,
    tenant_update,
)
from apps.keys.services.tokens import (
    MAX_TOKEN_LIFETIME,
    TOKEN_USE_RESOLUTION,
    management_token_authenticate,
    management_token_create,
    management_token_revoke,
    management_token_update,
)

__all__ = [
    "INVITATION_LIFETIME",
    "LIMIT_NAMES",
    "MAX_ROTATION_GRACE",
    "MAX_TOKEN_LIFETIME",
    "NEW_ACCOUNT_LIMITS",
    "NEW_ACCOUNT_MONTHLY_TOKENS",
    "TOKEN_USE_RESOLUTION",
    "api_key_create",
    "api_key_publish",
    "api_key_revoke",
    "api_key_rotate",
    "api_key_signing_enable",
    "api_key_update",
    "invitation_accept",
    "invitation_withdraw",
    "management_token_authenticate",
    "management_token_create",
    "management_token_revoke",
    "management_token_update",
    "member_invite",
    "member_remove",
    "member_role_change",
    "plan_delete",
    "plan_edit",
    "plan_publish",
    "plan_save",
    "tenant_approve",
    "tenant_create",
    "tenant_keys_publish",
    "tenant_sign_up",
    "tenant_update",
]
