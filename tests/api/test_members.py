"""/api/v1/members, /invitations and /tokens: owners manage members and invitations; everyone
manages their own management tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.keys.choices import MemberRole
from apps.keys.models import Invitation, ManagementToken, Membership
from apps.keys.services import management_token_authenticate
from tests.api.conftest import API, as_caller, bearer_client, error_of
from tests.keys.factories import make_member

pytestmark = pytest.mark.django_db


def test_members_are_listed_with_their_roles(owner, member):
    response = member.client.get(f"{API}/members")
    assert response.status_code == 200
    rows = [(row["email"], row["role"]) for row in response.json()["results"]]
    assert sorted(rows) == sorted([(owner.user.email, "owner"), (member.user.email, "member")])
    one = member.client.get(f"{API}/members/{owner.membership.id}")
    assert (one.status_code, one.json()["role"]) == (200, "owner")


def test_owners_change_roles_and_remove_members(owner, member):
    url = f"{API}/members/{member.membership.id}"
    response = owner.client.patch(url, {"role": "owner"}, format="json")
    assert (response.status_code, response.json()["role"]) == (200, "owner")
    member.membership.refresh_from_db()
    assert member.membership.role == MemberRole.OWNER
    assert owner.client.patch(url, {"role": "admin"}, format="json").status_code == 400
    assert owner.client.delete(url).status_code == 204
    assert not Membership.objects.filter(id=member.membership.id).exists()
    # Gone from the tenant, their token acts nowhere.
    assert member.client.get(f"{API}/keys").status_code == 401


def test_a_tenant_keeps_an_owner(owner):
    url = f"{API}/members/{owner.membership.id}"
    demoted = owner.client.patch(url, {"role": "member"}, format="json")
    assert demoted.status_code == 400 and "owner" in error_of(demoted)["message"]
    removed = owner.client.delete(url)
    assert removed.status_code == 400
    owner.membership.refresh_from_db()
    assert owner.membership.role == MemberRole.OWNER


def test_members_change_no_member(owner, member):
    for response in (
        member.client.patch(
            f"{API}/members/{owner.membership.id}", {"role": "member"}, format="json"
        ),
        member.client.delete(f"{API}/members/{owner.membership.id}"),
        member.client.post(f"{API}/invitations", {"email": "x@example.com"}, format="json"),
    ):
        assert response.status_code == 403
    owner.membership.refresh_from_db()
    assert owner.membership.role == MemberRole.OWNER and not Invitation.objects.exists()


def test_invite_sends_the_mail_and_lists_the_invitation(owner, member, mailoutbox):
    response = owner.client.post(
        f"{API}/invitations", {"email": "new@example.com", "role": "owner"}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["email"], body["role"], body["invited_by"]) == (
        "new@example.com",
        "owner",
        owner.user.email,
    )
    (mail,) = mailoutbox
    assert mail.to == ["new@example.com"] and "/invitations/" in mail.body
    assert "token" not in body and "token_hash" not in body
    listed = member.client.get(f"{API}/invitations").json()["results"]
    assert [row["id"] for row in listed] == [body["id"]]


def test_inviting_a_member_or_a_bad_address_is_a_400(owner, member, mailoutbox):
    again = owner.client.post(f"{API}/invitations", {"email": member.user.email}, format="json")
    assert again.status_code == 400 and error_of(again)["param"] == "email"
    bad = owner.client.post(f"{API}/invitations", {"email": "nobody"}, format="json")
    assert bad.status_code == 400 and error_of(bad)["param"] == "email"
    assert mailoutbox == []


def test_withdrawn_invitations_are_gone(owner, mailoutbox):
    created = owner.client.post(f"{API}/invitations", {"email": "w@example.com"}, format="json")
    url = f"{API}/invitations/{created.json()['id']}"
    assert owner.client.get(url).status_code == 200
    assert owner.client.delete(url).status_code == 204
    assert not Invitation.objects.exists()
    assert owner.client.get(url).status_code == 404


def test_accepted_invitations_are_not_open(owner, mailoutbox):
    created = owner.client.post(f"{API}/invitations", {"email": "a@example.com"}, format="json")
    Invitation.objects.filter(id=created.json()["id"]).update(accepted_at=timezone.now())
    assert owner.client.get(f"{API}/invitations").json()["results"] == []
    assert owner.client.delete(f"{API}/invitations/{created.json()['id']}").status_code == 404


def test_tokens_are_the_callers_own(owner, member):
    others = as_caller(owner.membership)  # a second token of the owner's
    listed = owner.client.get(f"{API}/tokens").json()["results"]
    assert {row["token_id"] for row in listed} == {owner.token.token_id, others.token.token_id}
    assert member.client.get(f"{API}/tokens").json()["results"][0]["token_id"] == (
        member.token.token_id
    )
    assert member.client.get(f"{API}/tokens/{owner.token.token_id}").status_code == 404
    assert member.client.post(f"{API}/tokens/{owner.token.token_id}/revoke").status_code == 404
    shown = owner.client.get(f"{API}/tokens/{others.token.token_id}").json()
    assert shown["scope"] == "write" and "secret" not in shown and "secret_hash" not in shown


def test_create_a_token_its_secret_once_and_it_works(member):
    expires = (timezone.now() + timedelta(days=10)).isoformat()
    response = member.client.post(
        f"{API}/tokens", {"name": "ci", "scope": "read", "expires_at": expires}, format="json"
    )
    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    token = ManagementToken.objects.get(token_id=response.json()["token_id"])
    assert (token.user, token.tenant, token.scope) == (member.user, member.tenant, "read")
    assert bearer_client(secret).get(f"{API}/keys").status_code == 200
    assert secret not in member.client.get(f"{API}/tokens").content.decode()


def test_a_token_lives_a_year_at_most(member):
    too_long = (timezone.now() + timedelta(days=400)).isoformat()
    response = member.client.post(
        f"{API}/tokens", {"name": "ci", "scope": "read", "expires_at": too_long}, format="json"
    )
    assert response.status_code == 400 and error_of(response)["param"] == "expires_at"


def test_a_read_only_token_mints_no_token(reader):
    expires = (timezone.now() + timedelta(days=10)).isoformat()
    response = reader.client.post(
        f"{API}/tokens", {"name": "up", "scope": "write", "expires_at": expires}, format="json"
    )
    assert response.status_code == 403
    assert not ManagementToken.objects.filter(name="up").exists()


def test_revoking_a_token_ends_it(owner):
    doomed = as_caller(owner.membership)
    response = owner.client.post(f"{API}/tokens/{doomed.token.token_id}/revoke")
    assert response.status_code == 200 and response.json()["revoked_at"]
    assert management_token_authenticate(plaintext=doomed.secret) is None
    refused = doomed.client.get(f"{API}/keys")
    assert refused.status_code == 401 and error_of(refused)["code"] == "authentication_failed"


def test_a_member_of_two_tenants_acts_in_the_tokens_tenant(owner, stranger):
    both = make_member(stranger.tenant, owner.user, role=MemberRole.MEMBER)
    in_stranger = as_caller(both)
    rows = in_stranger.client.get(f"{API}/members").json()["results"]
    assert {row["email"] for row in rows} == {owner.user.email, stranger.user.email}
    assert in_stranger.client.get(f"{API}/members/{owner.membership.id}").status_code == 404
