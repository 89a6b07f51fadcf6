"""Tenancy services: sign-up, approval, members and invitations, rotation, management tokens,
quotas; against real PostgreSQL and Redis."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.billing.counters import period_bounds
from apps.keys.choices import MemberRole, QuotaPeriod, TokenScope
from apps.keys.keycache import KeyRecord, record_key
from apps.keys.models import Membership, Plan, PlanQuota, Tenant
from apps.keys.ratelimit import quota_key
from apps.keys.selectors import key_record_load, membership_find, quota_status
from apps.keys.services import (
    api_key_create,
    api_key_rotate,
    invitation_accept,
    management_token_authenticate,
    management_token_create,
    management_token_revoke,
    member_invite,
    member_remove,
    member_role_change,
    plan_publish,
    tenant_approve,
    tenant_sign_up,
)
from dmxplatform import credentials
from dmxplatform.redis_client import request_redis, sync_redis
from tests.keys.factories import make_api_key, make_member, make_tenant, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def _accept_url(token: str) -> str:
    return f"https://portal.example/invitations/{token}/"


def test_a_new_account_owns_a_tenant_on_the_default_plan_and_may_create_keys(settings):
    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = False
    user = make_user("ada@example.com")
    tenant = tenant_sign_up(user=user)
    assert tenant.plan.name == settings.DMX_DEFAULT_PLAN
    # The migration seeds the default plan with limits: a new account is never unlimited.
    assert tenant.plan.requests_per_minute and tenant.plan.quotas.exists()
    assert Membership.objects.get(tenant=tenant, user=user).role == MemberRole.OWNER
    assert tenant.is_approved
    api_key_create(tenant=tenant, name="first")


def test_a_sign_up_without_the_default_plan_gets_one_with_limits_never_an_unlimited_tenant(
    settings,
):
    Plan.objects.filter(name=settings.DMX_DEFAULT_PLAN).delete()
    tenant = tenant_sign_up(user=make_user())
    assert tenant.plan.requests_per_minute and tenant.plan.tokens_per_minute
    assert tenant.plan.quotas.get(period=QuotaPeriod.MONTH, model="").tokens > 0


def test_with_approval_required_a_new_tenant_creates_no_key_until_approved(settings):
    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = True
    tenant = tenant_sign_up(user=make_user())
    assert not tenant.is_approved
    with pytest.raises(ValidationError, match="approval"):
        api_key_create(tenant=tenant, name="too early")
    tenant_approve(tenant=tenant)
    api_key_create(tenant=tenant, name="now")


def test_two_sign_ups_with_the_same_local_part_get_distinct_tenants():
    first = tenant_sign_up(user=make_user("sam@one.example"))
    second = tenant_sign_up(user=make_user("sam@two.example"))
    assert first.slug != second.slug


def test_a_key_may_be_held_tighter_than_its_plan_never_looser():
    plan = Plan.objects.create(name="small", requests_per_minute=10)
    tenant = make_tenant()
    tenant.plan = plan
    tenant.save()
    api_key_create(tenant=tenant, name="tight", requests_per_minute=5)
    with pytest.raises(ValidationError) as refused:
        api_key_create(tenant=tenant, name="loose", requests_per_minute=11)
    assert "requests_per_minute" in refused.value.message_dict


def test_rotation_keeps_the_old_secret_for_the_grace_period_only():
    key, old = make_api_key()
    key, new = api_key_rotate(key=key, grace=timedelta(seconds=30))
    assert new != old and new.startswith(f"sk-dmx-{key.key_id}_")
    record = key_record_load(key.key_id)
    old_secret, new_secret = (credentials.split(k, "sk-dmx-")[1] for k in (old, new))

    def accepted(secret: str, at: float) -> bool:
        return any(credentials.secret_matches(secret, h) for h in record.secret_hashes(at))

    now = time.time()
    assert accepted(new_secret, now) and accepted(old_secret, now)
    assert accepted(new_secret, now + 31) and not accepted(old_secret, now + 31)


def test_rotation_without_grace_ends_the_old_secret_at_once_and_bounds_the_grace():
    key, old = make_api_key()
    key, _ = api_key_rotate(key=key, grace=timedelta(0))
    record = key_record_load(key.key_id)
    assert not any(
        credentials.secret_matches(credentials.split(old, "sk-dmx-")[1], h)
        for h in record.secret_hashes(time.time())
    )
    with pytest.raises(ValidationError):
        api_key_rotate(key=key, grace=timedelta(hours=25))


def test_an_invitation_is_mailed_and_good_once_for_the_invited_address():
    tenant = make_tenant()
    owner = make_member(tenant, role=MemberRole.OWNER).user
    member_invite(
        tenant=tenant,
        email="bo@example.com",
        role=MemberRole.MEMBER,
        invited_by=owner,
        accept_url=_accept_url,
    )
    body = mail.outbox[-1].body
    token = body.split("/invitations/")[1].split("/")[0]
    with pytest.raises(ValidationError, match=r"bo@example\.com"):
        invitation_accept(token=token, user=make_user("eve@example.com"))
    bo = make_user("bo@example.com")
    membership = invitation_accept(token=token, user=bo)
    assert (membership.tenant, membership.role) == (tenant, MemberRole.MEMBER)
    with pytest.raises(ValidationError, match="not valid"):
        invitation_accept(token=token, user=bo)


def test_an_unverified_address_cannot_accept_and_a_member_is_not_invited_twice():
    tenant = make_tenant()
    owner = make_member(tenant, role=MemberRole.OWNER).user
    member_invite(
        tenant=tenant,
        email="cy@example.com",
        role=MemberRole.OWNER,
        invited_by=owner,
        accept_url=_accept_url,
    )
    token = mail.outbox[-1].body.split("/invitations/")[1].split("/")[0]
    with pytest.raises(ValidationError):
        invitation_accept(token=token, user=make_user("cy@example.com", verified=False))
    with pytest.raises(ValidationError, match="Already"):
        member_invite(
            tenant=tenant,
            email=owner.email.upper(),
            role=MemberRole.MEMBER,
            invited_by=owner,
            accept_url=_accept_url,
        )


def test_a_tenant_keeps_at_least_one_owner():
    tenant = make_tenant()
    owner = make_member(tenant, role=MemberRole.OWNER)
    with pytest.raises(ValidationError):
        member_role_change(membership=owner, role=MemberRole.MEMBER)
    with pytest.raises(ValidationError):
        member_remove(membership=owner)
    second = make_member(tenant, role=MemberRole.OWNER)
    member_role_change(membership=owner, role=MemberRole.MEMBER)
    member_remove(membership=owner)
    assert list(Membership.objects.filter(tenant=tenant)) == [second]


def test_membership_find_acts_only_in_the_users_own_tenants():
    mine, theirs = make_tenant(), make_tenant()
    user = make_user()
    make_member(mine, user)
    make_member(theirs)
    assert membership_find(user=user, tenant_id=theirs.id).tenant == mine
    assert membership_find(user=user, tenant_id=None).tenant == mine


def _token(user, tenant, **fields):
    fields.setdefault("expires_at", timezone.now() + timedelta(days=30))
    return management_token_create(
        user=user, tenant=tenant, name="ci", scope=fields.pop("scope", TokenScope.READ), **fields
    )


def test_a_management_token_authenticates_while_live_and_never_as_an_api_key():
    tenant = make_tenant()
    user = make_member(tenant).user
    token, plaintext = _token(user, tenant)
    assert plaintext.startswith("dmx-mgmt-")
    assert management_token_authenticate(plaintext=plaintext) == token
    assert management_token_authenticate(plaintext=plaintext + "x") is None
    _, api_key = make_api_key(tenant)
    assert management_token_authenticate(plaintext=api_key) is None
    management_token_revoke(token=token)
    assert management_token_authenticate(plaintext=plaintext) is None


def test_a_management_token_dies_with_its_expiry_and_with_its_users_membership():
    tenant = make_tenant()
    membership = make_member(tenant)
    token, plaintext = _token(membership.user, tenant)
    token.expires_at = timezone.now() - timedelta(seconds=1)
    token.save()
    assert management_token_authenticate(plaintext=plaintext) is None
    _, other = _token(membership.user, tenant)
    assert management_token_authenticate(plaintext=other) is not None
    membership.delete()
    assert management_token_authenticate(plaintext=other) is None
    with pytest.raises(ValidationError):
        _token(membership.user, tenant, expires_at=timezone.now() + timedelta(days=400))


def test_quota_status_reads_what_admission_counted_this_period():
    plan = Plan.objects.create(name="metered")
    PlanQuota.objects.create(plan=plan, period=QuotaPeriod.MONTH, model="", tokens=1000)
    tenant = make_tenant()
    tenant.plan = plan
    tenant.save()
    key, _ = make_api_key(tenant, token_quota=300, token_quota_period=QuotaPeriod.DAY)
    now = timezone.now()
    month, _, _ = period_bounds(QuotaPeriod.MONTH, now)
    day, _, day_end = period_bounds(QuotaPeriod.DAY, now)
    request_redis().set(quota_key(tenant.id, "tenant", tenant.id, month, ""), 250)
    request_redis().set(quota_key(tenant.id, "key", key.id, day, ""), 120)
    found = {(q.scope, q.period): q for q in quota_status(tenant=tenant, now=now)}
    assert (found["tenant", "month"].used, found["tenant", "month"].remaining) == (250, 750)
    assert (found["key", "day"].used, found["key", "day"].remaining) == (120, 180)
    assert found["key", "day"].key_id == key.key_id and found["key", "day"].resets_at == day_end


def test_a_plan_change_reaches_every_key_in_a_fixed_number_of_queries(
    django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    """A tenant's keys are republished together: the reads do not grow with the keys (one
    query per key before), and Redis gets them in one round trip after the commit."""
    plan = Plan.objects.create(name="wide", requests_per_minute=60)
    tenants = [make_tenant() for _ in range(2)]
    Tenant.objects.filter(id__in=[t.id for t in tenants]).update(plan=plan)
    keys = [make_api_key(tenants[i % 2])[0] for i in range(12)]
    plan.requests_per_minute = 61
    plan.save()
    with django_assert_max_num_queries(6), django_capture_on_commit_callbacks(execute=True):
        assert plan_publish(plan=plan) == 12
    client = sync_redis()
    for key in keys:
        stored = KeyRecord.decode(client.get(record_key(key.key_id)))
        assert stored.tenant_limits.requests_per_minute == 61
