"""Signed-in owners and members of tenants, and usage rows, for the portal's page tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import pytest
from django.test import Client

from apps.billing.models import UsageDaily, UsageRecord
from apps.keys.choices import MemberRole
from apps.keys.models import ApiKey, Membership, Tenant
from tests.keys.factories import make_member, make_tenant, make_user


@dataclass
class Person:
    tenant: Tenant
    membership: Membership
    client: Client

    @property
    def user(self):
        return self.membership.user


def sign_in(membership: Membership) -> Person:
    client = Client()
    client.force_login(membership.user)
    return Person(tenant=membership.tenant, membership=membership, client=client)


@pytest.fixture
def owner(db) -> Person:
    return sign_in(make_member(make_tenant(), role=MemberRole.OWNER))


@pytest.fixture
def member(owner) -> Person:
    """A member (not an owner) of the owner's tenant."""
    return sign_in(make_member(owner.tenant, role=MemberRole.MEMBER))


@pytest.fixture
def stranger(db) -> Person:
    """The owner of another tenant."""
    return sign_in(make_member(make_tenant(), make_user(), role=MemberRole.OWNER))


def make_record(key: ApiKey, at: datetime, **fields) -> UsageRecord:
    """A finished request of `key`, with its daily total, as the ledger flush stores them."""
    record = UsageRecord.objects.create(
        request_id=fields.pop("request_id", f"req_{uuid.uuid4().hex}"),
        api_key=key,
        tenant=key.tenant,
        created_at=at,
        endpoint="chat.completions",
        model=fields.pop("model", "dmx-tiny"),
        status="ok",
        http_status=200,
        prompt_tokens=fields.pop("prompt_tokens", 10),
        completion_tokens=fields.pop("completion_tokens", 5),
        **fields,
    )
    daily, _ = UsageDaily.objects.get_or_create(
        day=at.date(),
        api_key=key,
        tenant=key.tenant,
        model=record.model,
        batch=bool(record.batch_id),
    )
    daily.requests += 1
    daily.prompt_tokens += record.prompt_tokens
    daily.cached_tokens += record.cached_tokens
    daily.completion_tokens += record.completion_tokens
    daily.cost += record.cost
    daily.save()
    return record


SECRET_TAG = '<code id="secret" class="secret">'


def shown_secret(html: str) -> str:
    """The secret a page shows in #secret, exactly as a reader would copy it."""
    start = html.index(SECRET_TAG) + len(SECRET_TAG)
    return html[start : html.index("</code>", start)]


def table(html: str, table_id: str) -> str:
    """The HTML of the table with that id."""
    start = html.index(f'id="{table_id}"')
    return html[start : html.index("</table>", start)]
