from __future__ import annotations

import asyncio
import importlib
import time
import uuid

from django.apps import apps as installed_apps
from django.contrib.auth.models import Group, User

from apps.billing import ledger
from apps.keys.choices import MemberRole
from apps.keys.keycache import KeyRecord
from apps.keys.models import ApiKey, Membership, Tenant
from apps.keys.services import api_key_create, tenant_create
from dmxplatform import streams
from dmxplatform.redis_client import request_redis, request_resp_client

STAFF_PASSWORD = "pw-long-enough-1"
_ROLES = importlib.import_module("apps.keys.migrations.0005_operator_and_viewer_groups")
_BILLING_ROLES = importlib.import_module("apps.billing.migrations.0003_console_roles")


def make_staff(role: str | None, **fields) -> User:
    """A staff user in the console group `role` (viewer, operator), or in none.

    The groups come from data migrations (keys' and billing's), which a test that flushes the
    database (transactional_db) takes away from the tests after it: where they are gone, the
    migrations' own code makes them again.
    """
    suffix = uuid.uuid4().hex[:6]
    fields.setdefault("email", f"{role or 'staff'}-{suffix}@example.com")
    user = User.objects.create_user(
        f"{role or 'staff'}-{suffix}", password=STAFF_PASSWORD, is_staff=True, **fields
    )
    if role:
        if not Group.objects.filter(name=role).exists():
            _ROLES._create_roles(installed_apps, None)
            _BILLING_ROLES.grant_roles(installed_apps)
            _BILLING_ROLES.grant_roles(installed_apps, app_label="batches")
        user.groups.add(Group.objects.get(name=role))
    return user


def make_tenant(**overrides) -> Tenant:
    suffix = uuid.uuid4().hex[:10]
    return tenant_create(
        name=overrides.get("name", f"Tenant {suffix}"), slug=overrides.get("slug", f"t-{suffix}")
    )


def make_user(email: str | None = None, *, verified: bool = True, **fields):
    """A user who signed up with `email` (verified unless told otherwise), as allauth keeps it."""
    from allauth.account.models import EmailAddress
    from django.contrib.auth import get_user_model

    email = email or f"dev-{uuid.uuid4().hex[:8]}@example.com"
    user = get_user_model().objects.create_user(
        username=email, email=email, password=fields.pop("password", "pw-long-enough-1"), **fields
    )
    EmailAddress.objects.create(user=user, email=email, verified=verified, primary=True)
    return user


def make_member(tenant: Tenant, user=None, role: str = MemberRole.MEMBER) -> Membership:
    return Membership.objects.create(tenant=tenant, user=user or make_user(), role=role)


def make_api_key(tenant: Tenant | None = None, **overrides) -> tuple[ApiKey, str]:
    return api_key_create(
        tenant=tenant or make_tenant(),
        name=overrides.pop("name", f"key {uuid.uuid4().hex[:6]}"),
        **overrides,
    )


def make_key_record(key_id: str = "abcdefgh", **overrides) -> KeyRecord:
    """A key as the gateway caches it, without a database row behind it."""
    fields = dict(
        id=7,
        key_id=key_id,
        secret_hash="h",
        tenant_id=3,
        name="k",
        allowed_models=(),
        expires_at=None,
        revoked=False,
    )
    fields.update(overrides)
    return KeyRecord(**fields)


def run_with_redis(scenario, client=request_resp_client):
    """Run `await scenario(redis)` on a fresh event loop with a new lean client: the request
    store's (limits, leases, breakers), or the one `client()` makes."""

    async def main():
        redis = client()
        try:
            return await scenario(redis)
        finally:
            await redis.close()

    return asyncio.run(main())


def make_usage_event(key: ApiKey, **overrides) -> ledger.UsageEvent:
    """A finished request's usage event, as the gateway appends it."""
    fields = dict(
        request_id=f"req_{uuid.uuid4().hex}",
        api_key_id=key.id,
        tenant_id=key.tenant_id,
        created_at=time.time(),
        endpoint="chat.completions",
        model="m",
        status="ok",
        http_status=200,
        prompt_tokens=11,
        completion_tokens=7,
        timings={"auth": 0.01},
    )
    fields.update(overrides)
    return ledger.UsageEvent(**fields)


def append_usage(*events: ledger.UsageEvent) -> None:
    """Put events on their tenants' usage streams, as settling requests do."""
    for event in events:
        key = ledger.USAGE_STREAM.of_tenant(event.tenant_id).key()
        request_redis().xadd(key, {streams.FIELD: event.encode()})
