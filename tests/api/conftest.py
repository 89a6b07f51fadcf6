"""Callers of the management API: owners, members, strangers, operators and viewers, each with a
management token of their own, and the usage the ledger stores for a tenant's keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.billing.services import usage_flush
from apps.keys.choices import MemberRole, TokenScope
from apps.keys.models import ApiKey, ManagementToken, Membership, Tenant
from apps.keys.services import management_token_create
from tests.keys.factories import (
    append_usage,
    make_member,
    make_staff,
    make_tenant,
    make_usage_event,
)

API = "/api/v1"


@dataclass
class Caller:
    membership: Membership
    token: ManagementToken
    secret: str
    client: APIClient

    @property
    def tenant(self) -> Tenant:
        return self.membership.tenant

    @property
    def user(self):
        return self.membership.user


def bearer_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def as_caller(membership: Membership, scope: str = TokenScope.WRITE) -> Caller:
    """The member, calling with a fresh management token of `scope`."""
    token, secret = management_token_create(
        user=membership.user,
        tenant=membership.tenant,
        name=f"{scope} token",
        scope=scope,
        expires_at=timezone.now() + timedelta(days=30),
    )
    return Caller(membership=membership, token=token, secret=secret, client=bearer_client(secret))


@pytest.fixture(autouse=True)
def _own_redis_keys(private_redis):
    """Quotas and the fleet state these tests read are their own (tests/conftest.py)."""


@pytest.fixture
def owner(db) -> Caller:
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER))


@pytest.fixture
def member(owner) -> Caller:
    """A member, not an owner, of the owner's tenant."""
    return as_caller(make_member(owner.tenant, role=MemberRole.MEMBER))


@pytest.fixture
def reader(owner) -> Caller:
    """The owner, with a read-only token."""
    return as_caller(owner.membership, TokenScope.READ)


@pytest.fixture
def stranger(db) -> Caller:
    """The owner of another tenant."""
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER))


def as_staff(role: str | None) -> Caller:
    """A staff user in the console group `role` (operator, viewer), owner of a tenant of
    their own, calling with a management token that may write."""
    return as_caller(make_member(make_tenant(), user=make_staff(role), role=MemberRole.OWNER))


@pytest.fixture
def operator(db) -> Caller:
    """A staff user in the `operator` group."""
    return as_staff("operator")


@pytest.fixture
def viewer(db) -> Caller:
    """A staff user in the `viewer` group: looks at everything, changes nothing."""
    return as_staff("viewer")


def record_usage(key: ApiKey, **fields) -> str:
    """Store a finished request of `key` as the ledger does (record and daily total); return
    its request id."""
    event = make_usage_event(key, **fields)
    append_usage(event)
    usage_flush()
    return event.request_id


def error_of(response) -> dict:
    """The platform's error body, checked for its shape."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]
