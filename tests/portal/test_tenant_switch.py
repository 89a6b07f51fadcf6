"""The tenant switcher: a user acts in any tenant of theirs, never in another."""

from __future__ import annotations

from django.urls import reverse

from apps.keys.choices import MemberRole
from apps.keys.models import Membership
from apps.keys.selectors import SESSION_TENANT
from tests.keys.factories import make_api_key, make_tenant


def test_switching_to_an_own_tenant_changes_what_the_pages_show(owner):
    second = make_tenant(name="Second tenant")
    Membership.objects.create(tenant=second, user=owner.user, role=MemberRole.MEMBER)
    first_key, _ = make_api_key(owner.tenant)
    second_key, _ = make_api_key(second)

    response = owner.client.post(
        reverse("portal:tenant_switch"), {"tenant": second.id, "next": reverse("portal:usage")}
    )

    assert response.status_code == 302 and response["Location"] == reverse("portal:usage")
    assert owner.client.session[SESSION_TENANT] == second.id
    html = owner.client.get(reverse("portal:keys")).content.decode()
    assert 'id="tenant-name">Second tenant' in html
    assert second_key.key_id in html and first_key.key_id not in html
    # A member there: no owner controls.
    assert 'id="new-key"' not in html


def test_another_tenant_is_not_found(owner, stranger):
    theirs, _ = make_api_key(stranger.tenant)
    response = owner.client.post(reverse("portal:tenant_switch"), {"tenant": stranger.tenant.id})
    assert response.status_code == 404
    assert owner.client.session.get(SESSION_TENANT) != stranger.tenant.id
    html = owner.client.get(reverse("portal:keys")).content.decode()
    assert f'id="tenant-name">{owner.tenant.name}' in html and theirs.key_id not in html


def test_a_tenant_in_the_session_the_user_left_is_not_used(owner, stranger):
    """Removed from a tenant, the user's session falls back to a tenant still theirs."""
    session = owner.client.session
    session[SESSION_TENANT] = stranger.tenant.id
    session.save()
    html = owner.client.get(reverse("portal:keys")).content.decode()
    assert f'id="tenant-name">{owner.tenant.name}' in html


def test_the_switch_goes_only_to_local_pages(owner):
    response = owner.client.post(
        reverse("portal:tenant_switch"),
        {"tenant": owner.tenant.id, "next": "https://evil.example/phish"},
    )
    assert response["Location"] == reverse("portal:keys")


def test_a_switch_without_a_tenant_is_a_400(owner):
    assert owner.client.post(reverse("portal:tenant_switch"), {"tenant": "x"}).status_code == 400
    assert owner.client.get(reverse("portal:tenant_switch")).status_code == 405
