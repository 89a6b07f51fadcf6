import pytest
from django.contrib.messages import get_messages

from apps.keys.models import ApiKey
from dmxplatform import credentials
from tests.keys.factories import make_tenant

pytestmark = pytest.mark.django_db


def test_creating_a_key_in_the_admin_shows_the_secret_once_and_stores_a_hash(admin_client):
    tenant = make_tenant()
    response = admin_client.post(
        "/admin/keys/apikey/add/",
        {
            "tenant": tenant.id,
            "name": "ci",
            "allowed_models": '["dmx-tiny"]',
            "allowed_networks": "[]",
            "priority": 1,
            "token_quota_period": "month",
            "expires_at_0": "",
            "expires_at_1": "",
        },
    )
    assert response.status_code == 302
    key = ApiKey.objects.get(tenant=tenant, name="ci")
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    secret_line = next(m for m in shown if "sk-dmx-" in m)
    plaintext = secret_line.rsplit(" ", 1)[1]
    assert credentials.split(plaintext, "sk-dmx-")[0] == key.key_id
    assert credentials.secret_matches(credentials.split(plaintext, "sk-dmx-")[1], key.secret_hash)
    assert plaintext not in key.secret_hash
    assert key.allowed_models == ["dmx-tiny"]
    change_page = f"/admin/keys/apikey/{key.id}/change/"
    assert plaintext in admin_client.get(change_page).content.decode()  # the one showing
    assert plaintext not in admin_client.get(change_page).content.decode()


def test_revoke_action(admin_client):
    from tests.keys.factories import make_api_key

    key, _ = make_api_key()
    admin_client.post("/admin/keys/apikey/", {"action": "revoke", "_selected_action": [key.id]})
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_the_admin_lists_tenants_waiting_for_approval_and_approves_them(admin_client, settings):
    from apps.keys.models import Membership, Tenant
    from apps.keys.services import tenant_sign_up
    from tests.keys.factories import make_user

    settings.DMX_ACCOUNT_APPROVAL_REQUIRED = True
    waiting = tenant_sign_up(user=make_user("pending@example.com"))
    approved = make_tenant()
    listed = admin_client.get("/admin/keys/tenant/?approval=pending").content.decode()
    assert waiting.slug in listed and approved.slug not in listed
    page = admin_client.get(f"/admin/keys/tenant/{waiting.id}/change/").content.decode()
    assert "pending@example.com" in page  # its owner, in the memberships inline
    response = admin_client.post(
        "/admin/keys/tenant/",
        {"action": "approve", "_selected_action": [waiting.id]},
        follow=True,
    )
    assert response.status_code == 200
    assert Tenant.objects.get(id=waiting.id).is_approved
    assert Membership.objects.filter(tenant=waiting).count() == 1
