from __future__ import annotations

import uuid

from apps.keys.models import ApiKey, Tenant
from apps.keys.services import api_key_create, tenant_create


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
