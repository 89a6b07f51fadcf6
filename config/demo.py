"""A first local run's set-up, across apps: the demo operator, tenant, key, models, routing table
and node token (manage.py dmx_demo, scripts/dev.sh)."""

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
from apps.models.choices import ModelKind
from apps.models.models import LlmModel, ModelVersion
from apps.models.services import llm_model_create, model_version_create
from apps.routing.models import RoutingRule
from apps.routing.services import routing_rule_save

DEMO_TENANT = "demo"
DEMO_OPERATOR = "admin"
# The demo models' prices per million tokens: input, cached input, output.
DEMO_PRICES = (Decimal("0.15"), Decimal("0.075"), Decimal("0.60"))
# The alias the demo's routing table defines: code to the code model; any other intent, and
# any label the classifier is unsure of (its default route, ""), to the general model.
DEMO_ALIAS = "auto"
# The classifier's label for code (apps.gateway.intent.Intent.CODE, which only the gateway's
# own importers may read).
CODE_INTENT = "code"


@dataclass(frozen=True)
class DemoCredentials:
    operator: str
    operator_password: str | None
    api_key: str | None
    node_token: str | None


@transaction.atomic
def demo_setup(
    *,
    model_name: str,
    version: str,
    source: str,
    max_context_tokens: int,
    code_model_name: str = "",
    embed_model_name: str = "",
) -> DemoCredentials:
    """Create what a first local run needs, once; secrets are returned only when created now.

    `code_model_name`: a second model of the same weights, and the routing table's `auto` alias
    that sends code to it and everything else to `model_name`. `embed_model_name`: an embedding
    model of the same weights, priced as the others (a model without a price is refused)."""
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

    model = _demo_model(model_name, version, source, max_context_tokens)
    if code_model_name:
        code_model = _demo_model(code_model_name, version, source, max_context_tokens)
        demo_routing_setup(general=model, code=code_model)
    if embed_model_name:
        _demo_model(embed_model_name, version, source, max_context_tokens, kind=ModelKind.EMBED)

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


def _demo_model(
    name: str, version: str, source: str, max_context_tokens: int, kind: str = ModelKind.GENERATE
) -> LlmModel:
    """The model `name` with its version `version`, priced at DEMO_PRICES when created now."""
    model = LlmModel.objects.filter(name=name).first() or llm_model_create(
        name=name, max_context_tokens=max_context_tokens, kind=kind
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
    return model


def demo_routing_setup(*, general: LlmModel, code: LlmModel) -> None:
    """Route DEMO_ALIAS by intent: code to `code`, the rest to `general`. A route the alias
    has already (the operator's, maybe changed since) is left as it is."""
    for intent, model in (("", general), (CODE_INTENT, code)):
        if not RoutingRule.objects.filter(alias=DEMO_ALIAS, intent=intent).exists():
            routing_rule_save(rule=RoutingRule(alias=DEMO_ALIAS, intent=intent, model=model))
