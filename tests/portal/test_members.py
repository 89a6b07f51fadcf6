"""Members and invitations: owners invite by email, change roles, remove, withdraw; the invited
person joins with their verified address; other tenants' people are not found."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.urls import reverse

from apps.keys.choices import MemberRole
from apps.keys.models import Invitation, Membership
from tests.keys.factories import make_member, make_user
from tests.portal.conftest import sign_in


def _invite(owner, email: str, role: str = MemberRole.MEMBER):
    return owner.client.post(reverse("portal:members"), {"email": email, "role": role})


def _accept_path(message) -> str:
    found = re.search(r"http://testserver(/invitations/[^/\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


def test_an_invitation_mails_an_absolute_link_and_is_listed(owner):
    response = _invite(owner, "new@example.com", MemberRole.OWNER)
    assert response.status_code == 302
    message = mail.outbox[-1]
    assert message.to == ["new@example.com"] and owner.tenant.name in message.subject
    assert _accept_path(message)
    html = owner.client.get(reverse("portal:members")).content.decode()
    invitations = html[html.index('id="invitations-table"') :]
    assert "new@example.com" in invitations and "Owner" in invitations


def test_the_invited_user_joins_with_their_verified_address(owner, client):
    _invite(owner, "joiner@example.com")
    path = _accept_path(mail.outbox[-1])

    # Signed out: told who invited whom, with links that come back here.
    anonymous = client.get(path)
    html = anonymous.content.decode()
    assert anonymous.status_code == 200
    assert "joiner@example.com" in html and owner.tenant.name in html
    assert f"{reverse('account_login')}?next={path}" in html
    assert f"{reverse('account_signup')}?next={path}" in html

    joiner = make_user("joiner@example.com")
    client.force_login(joiner)
    response = client.post(path)
    assert response.status_code == 302 and response["Location"] == reverse("portal:keys")
    membership = Membership.objects.get(user=joiner, tenant=owner.tenant)
    assert membership.role == MemberRole.MEMBER
    # The joined tenant is the one the portal now shows.
    keys = client.get(reverse("portal:keys")).content.decode()
    assert f'id="tenant-name">{owner.tenant.name}' in keys
    # Good for one acceptance.
    assert client.get(path).status_code == 404


def test_someone_else_cannot_use_the_invitation(owner, client):
    _invite(owner, "right@example.com")
    path = _accept_path(mail.outbox[-1])
    client.force_login(make_user("wrong@example.com"))
    response = client.post(path)
    assert response.status_code == 400
    assert "This invitation is for right@example.com" in response.content.decode()
    assert not Membership.objects.filter(tenant=owner.tenant, user__email="wrong@example.com")


def test_an_unverified_address_cannot_accept(owner, client):
    _invite(owner, "unverified@example.com")
    path = _accept_path(mail.outbox[-1])
    client.force_login(make_user("unverified@example.com", verified=False))
    assert client.post(path).status_code == 400
    assert not Membership.objects.filter(tenant=owner.tenant, user__email="unverified@example.com")


def test_an_unknown_invitation_is_not_found(client, db):
    response = client.get(reverse("portal:invitation_accept", args=["no-such-token"]))
    assert response.status_code == 404 and "not valid" in response.content.decode()


def test_inviting_a_member_again_is_refused_on_the_field(owner, member):
    response = _invite(owner, member.user.email)
    assert response.status_code == 400
    assert "Already a member" in " ".join(response.context["invite_form"].errors["email"])


def test_owners_change_roles_but_keep_one_owner(owner, member):
    url = reverse("portal:member_role", args=[member.membership.id])
    owner.client.post(url, {"role": MemberRole.OWNER})
    member.membership.refresh_from_db()
    assert member.membership.is_owner

    # Two owners: one may step down; the last one may not.
    owner.client.post(
        reverse("portal:member_role", args=[owner.membership.id]), {"role": MemberRole.MEMBER}
    )
    owner.membership.refresh_from_db()
    assert not owner.membership.is_owner
    last = sign_in(member.membership)
    response = last.client.post(url, {"role": MemberRole.MEMBER}, follow=True)
    member.membership.refresh_from_db()
    assert member.membership.is_owner
    assert "keeps at least one owner" in response.content.decode()


def test_owners_remove_members_after_confirming(owner, member):
    url = reverse("portal:member_remove", args=[member.membership.id])
    assert 'id="confirm-form"' in owner.client.get(url).content.decode()
    assert Membership.objects.filter(id=member.membership.id).exists()
    owner.client.post(url)
    assert not Membership.objects.filter(id=member.membership.id).exists()


def test_owners_withdraw_an_invitation(owner):
    _invite(owner, "later@example.com")
    path = _accept_path(mail.outbox[-1])
    invitation = Invitation.objects.get(tenant=owner.tenant)
    owner.client.post(reverse("portal:invitation_withdraw", args=[invitation.id]))
    assert not Invitation.objects.filter(id=invitation.id).exists()
    assert owner.client.get(path).status_code == 404


def test_members_are_refused_every_change(owner, member):
    _invite(owner, "pending@example.com")
    invitation = Invitation.objects.get(tenant=owner.tenant)
    client = member.client
    assert _invite(member, "x@example.com").status_code == 403
    role = reverse("portal:member_role", args=[owner.membership.id])
    assert client.post(role, {"role": MemberRole.MEMBER}).status_code == 403
    remove = reverse("portal:member_remove", args=[owner.membership.id])
    assert client.post(remove).status_code == 403
    withdraw = reverse("portal:invitation_withdraw", args=[invitation.id])
    assert client.post(withdraw).status_code == 403
    owner.membership.refresh_from_db()
    assert owner.membership.is_owner
    assert Invitation.objects.filter(id=invitation.id).exists()
    assert not Invitation.objects.filter(email="x@example.com").exists()


@pytest.mark.parametrize("action", ["role", "remove"])
def test_another_tenants_members_are_not_found(owner, stranger, action):
    theirs = make_member(stranger.tenant)
    url = reverse(f"portal:member_{action}", args=[theirs.id])
    assert owner.client.post(url, {"role": MemberRole.OWNER}).status_code == 404
    assert Membership.objects.get(id=theirs.id).role == MemberRole.MEMBER
    html = owner.client.get(reverse("portal:members")).content.decode()
    assert theirs.user.email not in html and stranger.user.email not in html


def test_another_tenants_invitation_cannot_be_withdrawn(owner, stranger):
    _invite(stranger, "theirs@example.com")
    invitation = Invitation.objects.get(tenant=stranger.tenant)
    url = reverse("portal:invitation_withdraw", args=[invitation.id])
    assert owner.client.post(url).status_code == 404
    assert Invitation.objects.filter(id=invitation.id).exists()
    assert "theirs@example.com" not in owner.client.get(reverse("portal:members")).content.decode()
