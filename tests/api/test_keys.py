"""/api/v1/keys: list, create (the secret once), show, change, rotate, revoke; owners change,
members and read-only tokens only read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.keys.models import ApiKey, Plan
from dmxplatform import credentials
from tests.api.conftest import API, error_of, record_usage
from tests.keys.factories import make_api_key

pytestmark = pytest.mark.django_db


def secret_works(key: ApiKey, secret: str) -> bool:
    """Whether `secret` is the key's current secret (the hash the gateway checks)."""
    key.refresh_from_db()
    return credentials.secret_matches(credentials.split(secret, "sk-dmx-")[1], key.secret_hash)


def test_create_shows_the_secret_once(owner):
    response = owner.client.post(
        f"{API}/keys",
        {
            "name": "ci",
            "allowed_models": ["dmx-tiny"],
            "allowed_networks": ["10.0.0.0/8"],
            "requests_per_minute": 30,
            "token_quota": 1000,
            "token_quota_period": "day",
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    key = ApiKey.objects.get(key_id=body["key_id"])
    assert key.tenant == owner.tenant and key.created_by == owner.user
    assert body["secret"].startswith(f"sk-dmx-{key.key_id}_") and secret_works(key, body["secret"])
    assert (body["allowed_models"], body["allowed_networks"]) == (["dmx-tiny"], ["10.0.0.0/8"])
    assert (body["requests_per_minute"], body["token_quota"]) == (30, 1000)
    assert body["prefix"] == f"sk-dmx-{key.key_id}_…"
    # Never again: neither listed nor shown.
    listed = owner.client.get(f"{API}/keys").content.decode()
    shown = owner.client.get(f"{API}/keys/{key.key_id}").content.decode()
    secret_part = credentials.split(body["secret"], "sk-dmx-")[1]
    assert secret_part not in listed and secret_part not in shown and '"secret"' not in listed


def test_list_shows_last_use_and_this_months_tokens(owner):
    key, _ = make_api_key(owner.tenant, name="used")
    idle, _ = make_api_key(owner.tenant, name="idle")
    record_usage(key, prompt_tokens=30, completion_tokens=12)
    response = owner.client.get(f"{API}/keys")
    assert response.status_code == 200
    rows = {row["key_id"]: row for row in response.json()["results"]}
    assert set(rows) == {key.key_id, idle.key_id}
    assert rows[key.key_id]["month_tokens"] == 42 and rows[key.key_id]["last_used_at"]
    assert (rows[idle.key_id]["month_tokens"], rows[idle.key_id]["last_used_at"]) == (0, None)


def test_list_filters_revoked_keys(owner):
    live, _ = make_api_key(owner.tenant)
    gone, _ = make_api_key(owner.tenant)
    owner.client.post(f"{API}/keys/{gone.key_id}/revoke")

    def ids(query: str) -> list[str]:
        return [row["key_id"] for row in owner.client.get(f"{API}/keys{query}").json()["results"]]

    assert ids("?revoked=false") == [live.key_id]
    assert ids("?revoked=true") == [gone.key_id]
    assert error_of(owner.client.get(f"{API}/keys?revoked=maybe"))["param"] == "revoked"


def test_update_changes_what_it_names_and_keeps_the_rest(owner):
    key, _ = make_api_key(owner.tenant, name="old", allowed_models=["a"])
    expiry = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    response = owner.client.patch(
        f"{API}/keys/{key.key_id}",
        {"name": "new", "expires_at": expiry.isoformat(), "tokens_per_minute": 500},
        format="json",
    )
    assert response.status_code == 200, response.content
    key.refresh_from_db()
    assert (key.name, key.expires_at, key.tokens_per_minute) == ("new", expiry, 500)
    assert key.allowed_models == ["a"]


def test_limits_beyond_the_plan_are_refused(owner):
    owner.tenant.plan = Plan.objects.create(name="small", requests_per_minute=10)
    owner.tenant.save()
    response = owner.client.post(
        f"{API}/keys", {"name": "greedy", "requests_per_minute": 11}, format="json"
    )
    assert response.status_code == 400
    assert error_of(response)["param"] == "requests_per_minute"
    assert not ApiKey.objects.filter(tenant=owner.tenant).exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": ""}, "name"),
        ({"name": "k", "allowed_networks": ["not-a-network"]}, "allowed_networks"),
        ({"name": "k", "allowed_models": "dmx-tiny"}, "allowed_models"),
        ({"name": "k", "requests_per_minute": 0}, "requests_per_minute"),
        ({"name": "k", "token_quota_period": "week"}, "token_quota_period"),
        ({"name": "k", "expires_at": "tomorrow"}, "expires_at"),
    ],
)
def test_bad_key_settings_are_a_400_naming_the_field(owner, body, param):
    response = owner.client.post(f"{API}/keys", body, format="json")
    assert response.status_code == 400 and error_of(response)["param"] == param


def test_a_tenant_waiting_for_approval_creates_no_key(owner):
    owner.tenant.approved_at = None
    owner.tenant.save()
    response = owner.client.post(f"{API}/keys", {"name": "early"}, format="json")
    assert response.status_code == 400 and "approval" in error_of(response)["message"]


def test_rotate_gives_a_new_secret_and_keeps_the_old_one_for_the_grace(owner):
    key, old = make_api_key(owner.tenant)
    response = owner.client.post(
        f"{API}/keys/{key.key_id}/rotate", {"grace_seconds": 600}, format="json"
    )
    assert response.status_code == 200, response.content
    new = response.json()["secret"]
    assert new != old and secret_works(key, new)
    assert key.key_id == response.json()["key_id"]
    grace_end = key.previous_secret_expires_at
    assert timedelta(seconds=590) < grace_end - timezone.now() <= timedelta(seconds=600)
    assert credentials.secret_matches(
        credentials.split(old, "sk-dmx-")[1], key.previous_secret_hash
    )


@pytest.mark.parametrize("grace", [-1, 86401, "soon", None])
def test_rotate_grace_is_0_to_24_hours(owner, grace):
    key, old = make_api_key(owner.tenant)
    response = owner.client.post(
        f"{API}/keys/{key.key_id}/rotate", {"grace_seconds": grace}, format="json"
    )
    assert response.status_code == 400 and error_of(response)["param"] == "grace_seconds"
    assert secret_works(key, old)


def test_revoke_then_no_rotation(owner):
    key, _ = make_api_key(owner.tenant)
    response = owner.client.post(f"{API}/keys/{key.key_id}/revoke")
    assert response.status_code == 200 and response.json()["revoked_at"]
    key.refresh_from_db()
    assert key.revoked_at is not None
    rotated = owner.client.post(
        f"{API}/keys/{key.key_id}/rotate", {"grace_seconds": 0}, format="json"
    )
    assert rotated.status_code == 400 and "revoked" in error_of(rotated)["message"]


def test_members_read_keys_but_change_none(owner, member):
    key, _ = make_api_key(owner.tenant, name="shared")
    assert member.client.get(f"{API}/keys").json()["results"][0]["key_id"] == key.key_id
    assert member.client.get(f"{API}/keys/{key.key_id}").status_code == 200
    writes = [
        ("post", f"{API}/keys", {"name": "mine"}),
        ("patch", f"{API}/keys/{key.key_id}", {"name": "renamed"}),
        ("post", f"{API}/keys/{key.key_id}/rotate", {"grace_seconds": 0}),
        ("post", f"{API}/keys/{key.key_id}/revoke", {}),
    ]
    for method, url, body in writes:
        response = getattr(member.client, method)(url, body, format="json")
        assert response.status_code == 403, (method, url)
        assert error_of(response)["code"] == "permission_denied"
    key.refresh_from_db()
    assert (key.name, key.revoked_at) == ("shared", None)
    assert ApiKey.objects.filter(tenant=owner.tenant).count() == 1


def test_a_read_only_token_reads_and_changes_nothing(reader):
    key, _ = make_api_key(reader.tenant, name="kept")
    assert reader.client.get(f"{API}/keys/{key.key_id}").status_code == 200
    for response in (
        reader.client.post(f"{API}/keys", {"name": "x"}, format="json"),
        reader.client.patch(f"{API}/keys/{key.key_id}", {"name": "y"}, format="json"),
        reader.client.post(f"{API}/keys/{key.key_id}/revoke"),
    ):
        assert response.status_code == 403
        assert "read-only" in error_of(response)["message"]
    key.refresh_from_db()
    assert (key.name, key.revoked_at) == ("kept", None)


def test_keys_are_found_by_their_public_id_only(owner):
    key, _ = make_api_key(owner.tenant)
    assert owner.client.get(f"{API}/keys/{key.pk}").status_code == 404
    assert owner.client.get(f"{API}/keys/{key.key_id}").status_code == 200
