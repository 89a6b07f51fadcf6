"""Every portal page renders for owners and members, as plain HTML (no JavaScript needed), in
the one layout; owner-only controls are not shown to members."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.keys.factories import make_api_key, make_user
from tests.portal.conftest import sign_in

PAGES = ["portal:keys", "portal:usage", "portal:members", "portal:tokens", "portal:docs"]


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("who", ["owner", "member"])
def test_every_page_renders_in_the_layout(request, page, who, private_redis):
    person = request.getfixturevalue(who)
    make_api_key(person.tenant, name="prod")
    response = person.client.get(reverse(page))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="tenant-name">' + person.tenant.name in html
    # The nav, the log-out form (a POST, not a link) and no approval banner.
    for target in PAGES:
        assert f'href="{reverse(target)}"' in html
    assert f'action="{reverse("account_logout")}"' in html
    assert 'id="approval-banner"' not in html


def test_home_sends_to_the_keys(owner):
    response = owner.client.get("/")
    assert response.status_code == 302
    assert response["Location"] == reverse("portal:keys")


@pytest.mark.parametrize("page", [*PAGES, "portal:key_create", "portal:home"])
def test_pages_need_a_sign_in(client, db, page):
    response = client.get(reverse(page))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("account_login"))


def test_a_user_in_no_tenant_is_told_so(client, db):
    client.force_login(make_user())
    response = client.get(reverse("portal:keys"))
    assert response.status_code == 404
    assert "not a member of any tenant" in response.content.decode()


def test_members_do_not_see_owner_controls(owner, member):
    key, _ = make_api_key(owner.tenant)
    as_owner = owner.client.get(reverse("portal:keys")).content.decode()
    as_member = member.client.get(reverse("portal:keys")).content.decode()
    for html, shown in ((as_owner, True), (as_member, False)):
        assert (reverse("portal:key_create") in html) is shown
        assert (reverse("portal:key_rotate", args=[key.key_id]) in html) is shown
        assert (reverse("portal:key_revoke", args=[key.key_id]) in html) is shown
        assert key.display_prefix in html
    members_html = member.client.get(reverse("portal:members")).content.decode()
    assert 'id="invite-form"' not in members_html
    assert reverse("portal:member_remove", args=[owner.membership.id]) not in members_html
    assert owner.user.email in members_html


def test_the_account_pages_share_the_layout(client, owner):
    login = client.get(reverse("account_login")).content.decode()
    assert "portal/portal.css" in login and 'class="page narrow card"' in login
    assert 'name="login"' in login and 'name="password"' in login
    change = owner.client.get(reverse("account_change_password")).content.decode()
    assert "portal/portal.css" in change and 'id="tenant-name">' + owner.tenant.name in change
    assert 'name="oldpassword"' in change


def test_the_stylesheet_and_chart_js_come_from_static(owner):
    html = owner.client.get(reverse("portal:keys")).content.decode()
    assert "/static/portal/portal.css" in html
    usage = owner.client.get(reverse("portal:usage")).content.decode()
    assert "/static/vendor/chart.js/chart.umd.min.js" in usage


def test_a_signed_in_member_of_two_tenants_sees_the_switcher(owner, stranger):
    from apps.keys.models import Membership

    Membership.objects.create(tenant=stranger.tenant, user=owner.user, role="member")
    html = owner.client.get(reverse("portal:keys")).content.decode()
    assert f'action="{reverse("portal:tenant_switch")}"' in html
    assert f'<option value="{stranger.tenant.id}"' in html
    alone = sign_in(stranger.membership).client.get(reverse("portal:keys")).content.decode()
    assert 'id="tenant-switch"' not in alone
