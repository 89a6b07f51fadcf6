"""Accounts through allauth: sign up gives a tenant of one's own, the verification mail, and the
approval operators can require before keys are created."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse

from apps.keys.models import ApiKey, Membership

PASSWORD = "a-long-pass-phrase-9"


def _sign_up(client, email: str):
    return client.post(
        reverse("account_signup"), {"email": email, "password1": PASSWORD, "password2": PASSWORD}
    )


def _confirm_link(message) -> str:
    found = re.search(r"https?://[^/\s]+(/accounts/confirm-email/[^\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


def test_sign_up_gives_a_tenant_owned_by_the_new_account(client, db, settings):
    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = False
    response = _sign_up(client, "ada@example.com")

    assert response.status_code == 302
    assert response["Location"] == reverse("account_email_verification_sent")
    user = get_user_model().objects.get(email="ada@example.com")
    membership = Membership.objects.get(user=user)
    assert membership.is_owner
    assert membership.tenant.is_approved
    assert membership.tenant.plan.name == settings.DMX_DEFAULT_PLAN
    page = client.get(response["Location"]).content.decode()
    assert "Verify Your Email Address" in page and "portal/portal.css" in page


def test_the_verification_mail_signs_in_and_lands_on_the_keys(client, db):
    _sign_up(client, "grace@example.com")
    # Unverified: the account cannot sign in yet.
    login = client.post(
        reverse("account_login"), {"login": "grace@example.com", "password": PASSWORD}
    )
    assert login["Location"] == reverse("account_email_verification_sent")

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["grace@example.com"]
    assert message.subject.startswith("[DMX] ")
    link = _confirm_link(message)

    confirm = client.get(link)
    assert confirm.status_code == 200 and "grace@example.com" in confirm.content.decode()
    done = client.post(link)
    assert done.status_code == 302
    keys = client.get(done["Location"], follow=True)
    assert keys.redirect_chain[-1][0] == reverse("portal:keys")
    html = keys.content.decode()
    assert "API keys" in html and 'id="tenant-name">grace' in html


def test_an_account_waiting_for_approval_creates_no_key(client, db, settings):
    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = True
    _sign_up(client, "pending@example.com")
    client.post(_confirm_link(mail.outbox[0]))
    membership = Membership.objects.get(user__email="pending@example.com")
    assert not membership.tenant.is_approved

    keys = client.get(reverse("portal:keys")).content.decode()
    assert 'id="approval-banner"' in keys and "waiting for an operator" in keys
    assert 'id="new-key"' not in keys
    form = client.get(reverse("portal:key_create")).content.decode()
    assert "waiting for an operator" in form
    response = client.post(reverse("portal:key_create"), {"name": "k"})
    assert response.status_code == 400
    assert "waiting for an operator" in response.content.decode()
    assert not ApiKey.objects.filter(tenant=membership.tenant).exists()


@pytest.mark.parametrize("name", ["account_login", "account_signup", "account_reset_password"])
def test_the_entrance_pages_are_portal_pages(client, db, name):
    html = client.get(reverse(name)).content.decode()
    assert "portal/portal.css" in html and 'class="page narrow card"' in html
    assert 'class="button"' in html  # allauth's buttons in the portal's style


def test_password_reset_mails_a_link(client, db):
    _sign_up(client, "lin@example.com")
    mail.outbox.clear()
    response = client.post(reverse("account_reset_password"), {"email": "lin@example.com"})
    assert response.status_code == 302
    assert len(mail.outbox) == 1 and "/accounts/password/reset/key/" in mail.outbox[0].body


def test_password_change(owner):
    response = owner.client.post(
        reverse("account_change_password"),
        {"oldpassword": "pw-long-enough-1", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302
    owner.user.refresh_from_db()
    assert owner.user.check_password(PASSWORD)
