from __future__ import annotations

import asyncio
import uuid

from apps.keys.keycache import KeyRecord
from apps.keys.models import ApiKey, Tenant
from apps.keys.services import api_key_create, tenant_create
from dmxplatform.redis_client import resp_client


def make_tenant(**overrides) -> Tenant:
    suffix = uuid.uuid4().hex[:10]
    return tenant_create(
        name=overrides.get("name", f"Tenant {suffix}"), slug=overrides.get("slug", f"t-{suffix}")
    )


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


def run_with_redis(scenario):
    """Run `await scenario(redis)` on a fresh event loop with the request path's client."""

    async def main():
        redis = resp_client()
        try:
            return await scenario(redis)
        finally:
            await redis.close()

    return asyncio.run(main())
