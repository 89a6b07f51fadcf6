"""Who may call /api/v1/: a live management token, or the portal's session with its CSRF token;
never an API key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.keys.choices import MemberRole
from apps.keys.models import ApiKey, ManagementToken
from apps.keys.selectors import SESSION_TENANT
from apps.keys.services import management_token_revoke
from tests.api.conftest import API, bearer_client, error_of
from tests.keys.factories import make_api_key, make_member, make_tenant, make_user

pytestmark = pytest.mark.django_db

CSRF_SECRET = "c" * 32  # what Django's CSRF cookie holds; the header may carry it as it is


def refused(response) -> dict:
    assert response.status_code == 401, response.content
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="dmx-management"'
    return error_of(response)


def test_no_credential_is_a_401():
    assert refused(APIClient().get(f"{API}/keys"))["code"] == "not_authenticated"


@pytest.mark.parametrize(
    "credential", ["dmx-mgmt-abcdefgh_wrong", "dmx-mgmt-", "garbage", "dmx-mgmt-abcdefgh"]
)
def test_an_unknown_or_malformed_token_is_a_401(owner, credential):
    assert refused(bearer_client(credential).get(f"{API}/keys"))["code"] == "authentication_failed"


def test_a_wrong_secret_for_a_real_token_is_a_401(owner):
    forged = owner.secret[:-1] + ("A" if owner.secret[-1] != "A" else "B")
    refused(bearer_client(forged).get(f"{API}/keys"))
    assert owner.client.get(f"{API}/keys").status_code == 200


def test_an_api_key_is_never_a_management_credential(owner):
    key, plaintext = make_api_key(owner.tenant)
    error = refused(bearer_client(plaintext).get(f"{API}/keys"))
    assert "API key is not a management credential" in error["message"]
    # Not even to revoke itself.
    refused(bearer_client(plaintext).post(f"{API}/keys/{key.key_id}/revoke"))
    key.refresh_from_db()
    assert key.revoked_at is None


def test_expired_and_revoked_tokens_are_a_401(owner):
    ManagementToken.objects.filter(id=owner.token.id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    refused(owner.client.get(f"{API}/keys"))
    ManagementToken.objects.filter(id=owner.token.id).update(
        expires_at=timezone.now() + timedelta(days=1)
    )
    assert owner.client.get(f"{API}/keys").status_code == 200
    management_token_revoke(token=owner.token)
    refused(owner.client.get(f"{API}/keys"))


def test_a_deactivated_users_token_is_a_401(owner):
    owner.user.is_active = False
    owner.user.save()
    refused(owner.client.get(f"{API}/keys"))


def signed_in(user, tenant=None) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    if tenant is not None:
        session = client.session
        session[SESSION_TENANT] = tenant.id
        session.save()
    client.cookies["csrftoken"] = CSRF_SECRET
    return client


def test_the_session_reads_and_writes_with_its_csrf_token(owner):
    client = signed_in(owner.user)
    assert client.get(f"{API}/keys").status_code == 200
    refused_write = client.post(f"{API}/keys", {"name": "no csrf"}, format="json")
    assert refused_write.status_code == 403 and "CSRF" in error_of(refused_write)["message"]
    created = client.post(
        f"{API}/keys", {"name": "with csrf"}, format="json", HTTP_X_CSRFTOKEN=CSRF_SECRET
    )
    assert created.status_code == 201, created.content
    assert ApiKey.objects.get(key_id=created.json()["key_id"]).tenant == owner.tenant


def test_the_session_acts_in_the_tenant_the_portal_chose(owner, stranger):
    make_member(stranger.tenant, owner.user, role=MemberRole.MEMBER)
    mine, _ = make_api_key(owner.tenant)
    theirs, _ = make_api_key(stranger.tenant)

    def listed(client) -> list[str]:
        return [row["key_id"] for row in client.get(f"{API}/keys").json()["results"]]

    assert listed(signed_in(owner.user, owner.tenant)) == [mine.key_id]
    assert listed(signed_in(owner.user, stranger.tenant)) == [theirs.key_id]
    # A member there, not an owner: reads, but does not change.
    there = signed_in(owner.user, stranger.tenant)
    revoke = there.post(f"{API}/keys/{theirs.key_id}/revoke", HTTP_X_CSRFTOKEN=CSRF_SECRET)
    assert revoke.status_code == 403


def test_a_session_cannot_pick_a_tenant_it_is_not_in(owner, stranger):
    theirs, _ = make_api_key(stranger.tenant)
    client = signed_in(owner.user, stranger.tenant)  # falls back to the user's own tenant
    assert theirs.key_id not in client.get(f"{API}/keys").content.decode()
    assert client.get(f"{API}/keys/{theirs.key_id}").status_code == 404


def test_a_user_in_no_tenant_finds_nothing():
    client = signed_in(make_user())
    response = client.get(f"{API}/keys")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"


def test_a_suspended_tenant_is_no_tenant_to_act_in(owner):
    make_tenant()  # another tenant exists; the owner is not in it
    assert signed_in(owner.user).get(f"{API}/keys").status_code == 200
    owner.tenant.is_active = False
    owner.tenant.save()
    assert signed_in(owner.user).get(f"{API}/keys").status_code == 404
    assert owner.client.get(f"{API}/keys").status_code == 404
