"""Platform-wide setup that spans apps: the demo tenant, key, model and node token."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Lower
from django.utils import timezone

from apps.gateway.choices import SensitiveTermAction
from apps.gateway.content_filter import DEFAULT_CATEGORY
from apps.gateway.models import SensitiveTerm
from apps.hardware.models import NodeToken
from apps.hardware.services import node_token_create
from apps.keys.models import ApiKey, Tenant
from apps.keys.services import api_key_create, tenant_create
from apps.models.models import LlmModel, ModelVersion
from apps.models.services import llm_model_create, model_version_create
from dmxplatform.redis_client import rkey, sync_redis

DEMO_TENANT = "demo"
DEMO_OPERATOR = "admin"


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
        model_version_create(model=model, tag=version, source=source)

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


# Gateways compare this counter with the version of the filter they hold, and reload on a change.
CONTENT_FILTER_VERSION_KEY = ("content_filter", "version")


def content_filter_invalidate() -> None:
    """Tell every gateway to rebuild its content filter once the current transaction commits."""
    transaction.on_commit(lambda: sync_redis().incr(rkey(*CONTENT_FILTER_VERSION_KEY)))


def sensitive_term_create(
    *,
    term: str,
    category: str = DEFAULT_CATEGORY,
    action: SensitiveTermAction = SensitiveTermAction.BLOCK,
    is_active: bool = True,
) -> SensitiveTerm:
    sensitive_term = SensitiveTerm(
        term=term.strip(), category=category, action=action, is_active=is_active
    )
    sensitive_term.full_clean()
    sensitive_term.save()
    content_filter_invalidate()
    return sensitive_term


def sensitive_term_update(*, sensitive_term: SensitiveTerm) -> SensitiveTerm:
    """Save edits made to a term (admin) and tell the gateways."""
    sensitive_term.term = sensitive_term.term.strip()
    sensitive_term.full_clean()
    sensitive_term.save()
    content_filter_invalidate()
    return sensitive_term


def sensitive_term_delete(*, sensitive_term: SensitiveTerm) -> None:
    sensitive_term.delete()
    content_filter_invalidate()


def sensitive_term_bulk_delete(*, queryset: QuerySet[SensitiveTerm]) -> int:
    deleted, _ = queryset.delete()
    content_filter_invalidate()
    return deleted


def sensitive_term_bulk_set_active(*, queryset: QuerySet[SensitiveTerm], is_active: bool) -> int:
    changed = queryset.update(is_active=is_active, updated_at=timezone.now())
    content_filter_invalidate()
    return changed


@transaction.atomic
def sensitive_term_import(
    *,
    terms: Iterable[str],
    category: str = DEFAULT_CATEGORY,
    action: SensitiveTermAction = SensitiveTermAction.BLOCK,
) -> list[SensitiveTerm]:
    """Create the terms not stored yet (compared ignoring case) in one insert; return them."""
    wanted: dict[str, SensitiveTerm] = {}
    for text in terms:
        text = text.strip()
        if text and text.lower() not in wanted:
            wanted[text.lower()] = SensitiveTerm(term=text, category=category, action=action)
    existing = set(
        SensitiveTerm.objects.annotate(lowered=Lower("term"))
        .filter(lowered__in=list(wanted))
        .values_list("lowered", flat=True)
    )
    new = [row for lowered, row in wanted.items() if lowered not in existing]
    for row in new:
        # Uniqueness was settled above with one query rather than one per row.
        row.full_clean(validate_unique=False, validate_constraints=False)
    created = SensitiveTerm.objects.bulk_create(new)
    if created:
        content_filter_invalidate()
    return created
