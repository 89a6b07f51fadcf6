"""Keys in the portal: create (the secret once), rotate with a grace period, revoke; owners
only; another tenant's keys are not found."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.keys.models import KEY_PREFIX, ApiKey, Plan
from dmxplatform import credentials
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.portal.conftest import shown_secret


def _works(plaintext: str, key: ApiKey) -> bool:
    key.refresh_from_db()
    key_id, secret = credentials.split(plaintext, KEY_PREFIX)
    return key_id == key.key_id and credentials.secret_matches(secret, key.secret_hash)


def test_create_shows_the_secret_once(owner):
    make_model("dmx-tiny", max_context_tokens=2048)
    make_model("dmx-tiny-b")
    form = owner.client.get(reverse("portal:key_create")).content.decode()
    assert 'value="dmx-tiny"' in form and "2,048 tokens of context" in form

    response = owner.client.post(
        reverse("portal:key_create"),
        {
            "name": "prod",
            "expires_at": (timezone.now() + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M"),
            "allowed_models": ["dmx-tiny"],
            "allowed_networks": "10.0.0.0/8\n\n 192.168.1.0/24 \n",
            "requests_per_minute": "60",
            "token_quota": "10000",
            "token_quota_period": "day",
        },
    )

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    secret = shown_secret(response.content.decode())
    key = ApiKey.objects.get(tenant=owner.tenant)
    assert _works(secret, key)
    assert key.name == "prod" and key.created_by == owner.user
    assert key.allowed_models == ["dmx-tiny"]
    assert key.allowed_networks == ["10.0.0.0/8", "192.168.1.0/24"]
    assert key.requests_per_minute == 60 and key.tokens_per_minute is None
    assert (key.token_quota, key.token_quota_period) == (10000, "day")
    assert key.expires_at > timezone.now() + timedelta(days=29)
    # Never again: not in the list, not on the key's pages.
    for url in (
        reverse("portal:keys"),
        reverse("portal:key_rotate", args=[key.key_id]),
        reverse("portal:docs"),
    ):
        html = owner.client.get(url).content.decode()
        assert secret.partition("_")[2] not in html
        assert 'id="secret"' not in html
    assert key.display_prefix in owner.client.get(reverse("portal:keys")).content.decode()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"requests_per_minute": "101"}, "requests_per_minute", "At most 100, the plan"),
        ({"allowed_networks": "not-a-network"}, "allowed_networks", "not-a-network"),
        ({"name": ""}, "name", "This field is required"),
        ({"expires_at": "2001-01-01T00:00"}, "expires_at", "in the future"),
        ({"token_quota": "0"}, "token_quota", "greater than or equal to 1"),
    ],
)
def test_bad_keys_are_refused_on_their_field(owner, fields, field, message):
    owner.tenant.plan = Plan.objects.create(name=f"p-{owner.tenant.slug}", requests_per_minute=100)
    owner.tenant.save()
    response = owner.client.post(reverse("portal:key_create"), {"name": "k", **fields})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field])
    assert not ApiKey.objects.filter(tenant=owner.tenant).exists()
    assert 'id="secret"' not in response.content.decode()


def test_the_form_tells_the_plan_limits(owner):
    owner.tenant.plan = Plan.objects.create(name=f"p-{owner.tenant.slug}", tokens_per_minute=5000)
    owner.tenant.save()
    html = owner.client.get(reverse("portal:key_create")).content.decode()
    assert "Your plan allows at most 5,000." in html


def test_rotate_gives_a_new_secret_and_keeps_the_old_one_for_the_grace(owner):
    key, old = make_api_key(owner.tenant)
    page = owner.client.get(reverse("portal:key_rotate", args=[key.key_id]))
    assert 'name="grace_minutes"' in page.content.decode()

    before = timezone.now()
    response = owner.client.post(
        reverse("portal:key_rotate", args=[key.key_id]), {"grace_minutes": "0.1"}
    )

    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    new = shown_secret(response.content.decode())
    assert new != old and _works(new, key) and not _works(old, key)
    # The old secret's hash is kept for 0.1 minutes = 6 seconds.
    _, old_secret = credentials.split(old, KEY_PREFIX)
    assert credentials.secret_matches(old_secret, key.previous_secret_hash)
    grace = key.previous_secret_expires_at - before
    assert timedelta(seconds=5) < grace <= timedelta(seconds=7)
    assert 'id="grace"' in response.content.decode()


@pytest.mark.parametrize("grace", ["-1", "1441", "soon", ""])
def test_a_grace_outside_0_to_24_hours_is_refused(owner, grace):
    key, old = make_api_key(owner.tenant)
    response = owner.client.post(
        reverse("portal:key_rotate", args=[key.key_id]), {"grace_minutes": grace}
    )
    assert response.status_code == 400
    assert _works(old, key)


def test_a_rotation_without_grace_ends_the_old_secret_now(owner):
    key, _ = make_api_key(owner.tenant)
    owner.client.post(reverse("portal:key_rotate", args=[key.key_id]), {"grace_minutes": "0"})
    key.refresh_from_db()
    assert key.previous_secret_hash == "" and key.previous_secret_expires_at is None


def test_revoke_asks_first_then_revokes(owner):
    key, _ = make_api_key(owner.tenant, name="old one")
    url = reverse("portal:key_revoke", args=[key.key_id])
    page = owner.client.get(url)
    assert page.status_code == 200 and 'id="confirm-form"' in page.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is None

    response = owner.client.post(url, follow=True)
    key.refresh_from_db()
    assert key.revoked_at is not None
    html = response.content.decode()
    assert "is revoked" in html and '<span class="badge revoked">revoked</span>' in html
    # A revoked key offers no rotation.
    assert reverse("portal:key_rotate", args=[key.key_id]) not in html


def test_members_are_refused_every_change(member):
    key, secret = make_api_key(member.tenant)
    client = member.client
    assert client.get(reverse("portal:key_create")).status_code == 403
    assert client.post(reverse("portal:key_create"), {"name": "mine"}).status_code == 403
    rotate = reverse("portal:key_rotate", args=[key.key_id])
    assert client.post(rotate, {"grace_minutes": "0"}).status_code == 403
    assert client.post(reverse("portal:key_revoke", args=[key.key_id])).status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None and _works(secret, key)
    assert ApiKey.objects.filter(tenant=member.tenant).count() == 1


def test_another_tenants_key_is_not_found(owner, stranger):
    theirs, secret = make_api_key(stranger.tenant, name="their key")
    for name in ("portal:key_rotate", "portal:key_revoke"):
        url = reverse(name, args=[theirs.key_id])
        assert owner.client.get(url).status_code == 404
        assert owner.client.post(url, {"grace_minutes": "0"}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None and _works(secret, theirs)
    listing = owner.client.get(reverse("portal:keys")).content.decode()
    assert theirs.key_id not in listing and "their key" not in listing
