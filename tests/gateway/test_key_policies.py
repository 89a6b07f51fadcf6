"""Key policies through two gateway replicas: revocation and edits everywhere within a second,
client networks, request signing."""

from __future__ import annotations

import time

from apps.keys.services import api_key_revoke, api_key_signing_enable, api_key_update
from apps.keys.signing import signature_for
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

BODY = {"model": "dmx-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def chat(api_url: str, key: str, *, raw: bytes | None = None, headers=None):
    return call(
        "POST",
        api_url + "/chat/completions",
        key=key,
        json_body=None if raw is not None else BODY,
        raw=raw,
        headers=headers,
    )


def models(api_url: str, key: str):
    return call("GET", api_url + "/models", key=key)


def test_revocation_reaches_every_replica_within_a_second(platform, committed):
    key, secret = make_api_key()
    for api_url in platform.api_urls:
        assert models(api_url, secret).status == 200  # cached in both processes
    api_key_revoke(key=key)
    revoked_at = time.monotonic()
    for api_url in platform.api_urls:
        wait_for(
            lambda url=api_url: models(url, secret).status == 401,
            timeout=1.0 - (time.monotonic() - revoked_at),
            interval=0.02,
            what=f"revocation at {api_url}",
        )
    assert time.monotonic() - revoked_at < 1.0


def test_edits_reach_every_replica_within_a_second(platform, committed):
    key, secret = make_api_key()
    for api_url in platform.api_urls:
        assert chat(api_url, secret).status == 200  # allowed, and cached in both processes
    key.allowed_models = ["dmx-tiny-b"]
    api_key_update(key=key)
    edited_at = time.monotonic()
    for api_url in platform.api_urls:
        wait_for(
            lambda url=api_url: chat(url, secret).status == 404,
            timeout=1.0 - (time.monotonic() - edited_at),
            interval=0.02,
            what=f"the edit at {api_url}",
        )


def test_client_networks(platform, committed):
    _, outside = make_api_key(allowed_networks=["10.0.0.0/8", "2001:db8::/32"])
    reply = chat(platform.api_url, outside)
    assert reply.status == 403
    assert reply.json()["error"]["code"] == "ip_not_allowed"
    _, inside = make_api_key(allowed_networks=["127.0.0.0/8"])
    assert chat(platform.api_url, inside).status == 200


def test_signed_requests(platform, committed):
    key, secret = make_api_key()
    signing = api_key_signing_enable(key=key).encode()
    wait_for(lambda: chat(platform.api_url, secret).status == 401, timeout=1, what="signing on")
    unsigned = chat(platform.api_url, secret)
    assert unsigned.json()["error"]["code"] == "signature_required"

    import json

    raw = json.dumps(BODY).encode()
    stamp = str(int(time.time()))
    headers = {"X-DMX-Timestamp": stamp, "X-DMX-Signature": signature_for(signing, stamp, raw)}
    assert chat(platform.api_url, secret, raw=raw, headers=headers).status == 200
    # The same signed request again, even on the other replica, is a replay.
    replay = chat(platform.api_urls[1], secret, raw=raw, headers=headers)
    assert replay.status == 401
    assert replay.json()["error"]["code"] == "signature_replayed"
    tampered = chat(
        platform.api_url,
        secret,
        raw=raw.replace(b'"max_tokens": 1', b'"max_tokens": 2'),
        headers=headers,
    )
    assert tampered.json()["error"]["code"] == "signature_invalid"
    old = str(int(time.time()) - 3600)
    stale = {"X-DMX-Timestamp": old, "X-DMX-Signature": signature_for(signing, old, raw)}
    assert chat(platform.api_url, secret, raw=raw, headers=stale).json()["error"]["code"] == (
        "signature_expired"
    )


def test_a_rotated_keys_old_secret_works_on_every_replica_until_its_grace_ends(platform, committed):
    from datetime import timedelta

    from apps.keys.services import api_key_rotate

    key, old = make_api_key()
    for api_url in platform.api_urls:
        assert models(api_url, old).status == 200  # cached in both processes
    grace = 3.0
    rotating = time.monotonic()
    key, new = api_key_rotate(key=key, grace=timedelta(seconds=grace))
    rotated_at = time.monotonic()
    for api_url in platform.api_urls:
        wait_for(lambda url=api_url: models(url, new).status == 200, timeout=1.0, interval=0.02)
        assert models(api_url, old).status == 200, "the old secret lasts the grace period"
    assert time.monotonic() - rotated_at < grace
    wait_for(
        lambda: all(models(url, old).status == 401 for url in platform.api_urls),
        timeout=grace + 10,
        interval=0.1,
        what="the old secret's grace to end",
    )
    assert time.monotonic() - rotating >= grace, "refused before its grace ended"
    for api_url in platform.api_urls:
        refused = models(api_url, old)
        assert refused.status == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert models(api_url, new).status == 200
