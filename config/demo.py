"""A first local run's set-up, across apps: the demo operator, tenant, key, model and node
token (manage.py dmx_demo, scripts/dev.sh)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from apps.billing.services import price_set
from apps.hardware.models import NodeToken
from apps.hardware.services import node_token_create
from apps.keys.models import ApiKey, Tenant
from apps.keys.services import api_key_create, tenant_create
from apps.models.models import LlmModel, ModelVersion
from apps.models.services import llm_model_create, model_version_create

DEMO_TENANT = "demo"
DEMO_OPERATOR = "admin"
# The demo model's prices per million tokens: input, cached input, output.
DEMO_PRICES = (Decimal("0.15"), Decimal("0.075"), Decimal("0.60"))


@dataclass(frozen=True)
class DemoCredentials:
    operator: str
    operator_password: str | None
    api_key: str | None
    node_token: str | None


@transaction.atomic
def demo_setup(
    *, model_name: str, version: str, source: str, max_context_tokens: int
) -> DemoCredentials:
    """Create what a first local run needs, once; secrets are returned only when created now."""
    User = get_user_model()
    password = None
    if not User.objects.filter(username=DEMO_OPERATOR).exists():
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(DEMO_OPERATOR, email="admin@localhost", password=password)
    operator = User.objects.get(username=DEMO_OPERATOR)

    tenant = Tenant.objects.filter(slug=DEMO_TENANT).first() or tenant_create(
        name="Demo", slug=DEMO_TENANT
    )
    tenant.members.add(operator)

    model = LlmModel.objects.filter(name=model_name).first() or llm_model_create(
        name=model_name, max_context_tokens=max_context_tokens
    )
    if not ModelVersion.objects.filter(model=model, tag=version).exists():
        created = model_version_create(model=model, tag=version, source=source)
        price_set(
            model_version_id=created.id,
            input_per_million=DEMO_PRICES[0],
            cached_input_per_million=DEMO_PRICES[1],
            output_per_million=DEMO_PRICES[2],
            actor=DEMO_OPERATOR,
        )

    api_key = None
    if not ApiKey.objects.filter(tenant=tenant, name="demo", revoked_at__isnull=True).exists():
        _, api_key = api_key_create(tenant=tenant, name="demo", created_by=operator)
    node_token = None
    if not NodeToken.objects.filter(name="demo", revoked_at__isnull=True).exists():
        _, node_token = node_token_create(name="demo")
    return DemoCredentials(
        operator=DEMO_OPERATOR,
        operator_password=password,
        api_key=api_key,
        node_token=node_token,
    )
