"""Management tokens in the portal: created for a scope and an expiry, shown once, revoked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.keys.models import ManagementToken
from apps.keys.services import management_token_authenticate, management_token_create
from tests.portal.conftest import shown_secret


@pytest.mark.parametrize("who", ["owner", "member"])
def test_a_token_is_shown_once_and_authenticates(request, who):
    person = request.getfixturevalue(who)
    response = person.client.post(
        reverse("portal:tokens"), {"name": "ci", "scope": "write", "expires_in_days": "30"}
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    secret = shown_secret(response.content.decode())
    token = management_token_authenticate(plaintext=secret)
    assert token is not None
    assert (token.user, token.tenant, token.scope) == (person.user, person.tenant, "write")
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)

    listing = person.client.get(reverse("portal:tokens")).content.decode()
    assert token.display_prefix in listing and "Read and write" in listing
    assert 'id="secret"' not in listing and secret.partition("_")[2] not in listing


@pytest.mark.parametrize("days", ["0", "366", "", "ever"])
def test_an_expiry_beyond_a_year_is_refused(owner, days):
    response = owner.client.post(
        reverse("portal:tokens"), {"name": "ci", "scope": "read", "expires_in_days": days}
    )
    assert response.status_code == 400
    assert not ManagementToken.objects.exists()


def test_revoke_asks_first_then_revokes(owner):
    token, secret = management_token_create(
        user=owner.user,
        tenant=owner.tenant,
        name="ci",
        scope="read",
        expires_at=timezone.now() + timedelta(days=1),
    )
    url = reverse("portal:token_revoke", args=[token.token_id])
    assert 'id="confirm-form"' in owner.client.get(url).content.decode()
    assert management_token_authenticate(plaintext=secret) is not None
    owner.client.post(url)
    assert management_token_authenticate(plaintext=secret) is None


def test_someone_elses_token_is_not_found(owner, member):
    """Even in the same tenant: a token acts as its user, so only they see and revoke it."""
    token, secret = management_token_create(
        user=owner.user,
        tenant=owner.tenant,
        name="owner's",
        scope="write",
        expires_at=timezone.now() + timedelta(days=1),
    )
    url = reverse("portal:token_revoke", args=[token.token_id])
    assert member.client.post(url).status_code == 404
    assert management_token_authenticate(plaintext=secret) is not None
    assert token.token_id not in member.client.get(reverse("portal:tokens")).content.decode()
