"""The playground: its page, and its WebSocket against the running gateways (a signed-in user's
chat streamed through the /v1 pipeline and billed to the key they chose)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from apps.billing.models import UsageRecord
from apps.keys.choices import MemberRole
from apps.keys.models import ApiKey
from apps.keys.services import api_key_revoke
from apps.models.choices import ModelKind
from tests.keys.factories import make_api_key, make_member, make_tenant, make_user
from tests.models.factories import make_model
from tests.stack import wait_for

MODEL = "dmx-tiny"
# Greedy decoding of the tiny model's random weights never picks its end token early, so an
# answer runs to max_tokens and the counts below are the same every run.
GREEDY = 0.0


@dataclass
class Member:
    session: str  # the session cookie's value
    keys: list[ApiKey]


@pytest.mark.django_db
def test_the_page_offers_the_tenants_live_keys_each_with_its_models(client):
    make_model(MODEL)
    make_model("dmx-other")
    make_model("dmx-embedder", kind=ModelKind.EMBED)  # answers no chat: not offered
    tenant = make_tenant()
    user = make_user()
    make_member(tenant, user)
    restricted, _ = make_api_key(tenant, name="b restricted", allowed_models=[MODEL])
    unrestricted, _ = make_api_key(tenant, name="a unrestricted")
    api_key_revoke(key=make_api_key(tenant, name="revoked")[0])
    expired, _ = make_api_key(tenant, name="expired")
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    make_api_key(make_tenant(), name="another tenant's")

    assert client.get(reverse("portal:playground")).status_code == 302  # to the login page
    client.force_login(user)
    response = client.get(reverse("portal:playground"))

    assert response.status_code == 200
    assert [key.name for key in response.context["keys"]] == ["a unrestricted", "b restricted"]
    assert response.context["key_models"] == {unrestricted.key_id: [], restricted.key_id: [MODEL]}
    names = [model.name for model in response.context["models"]]  # e2e seeds may add more
    assert {"dmx-other", MODEL} <= set(names) and names == sorted(names)
    assert "dmx-embedder" not in names
    assert b'id="pg-key-models"' in response.content


@pytest.fixture
def member(committed) -> Member:
    """A signed-in member (not an owner: members use their tenant's keys) with two keys."""
    tenant = make_tenant()
    user = make_user()
    make_member(tenant, user, role=MemberRole.MEMBER)
    client = Client()
    client.force_login(user)
    keys = [make_api_key(tenant)[0] for _ in range(2)]
    return Member(session=client.cookies[settings.SESSION_COOKIE_NAME].value, keys=keys)


@contextmanager
def playground(
    platform, session: str | None, *, origin: str | None = None
) -> Iterator[ClientConnection]:
    url = platform.url.replace("http://", "ws://", 1) + "/ws/playground"
    cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}"} if session else None
    with connect(
        url, origin=origin or platform.url, additional_headers=cookie, proxy=None
    ) as socket:
        yield socket


def chat(key: ApiKey | object, max_tokens: int = 16, **fields) -> dict:
    return {
        "type": "chat",
        "key_id": key.key_id if isinstance(key, ApiKey) else key,
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tell me about the sea."},
        ],
        "temperature": GREEDY,
        "max_tokens": max_tokens,
        **fields,
    }


def send(socket: ClientConnection, message: dict | str) -> None:
    socket.send(message if isinstance(message, str) else json.dumps(message))


def receive(socket: ClientConnection) -> dict:
    return json.loads(socket.recv(timeout=60))


def answer(socket: ClientConnection) -> tuple[list[str], dict]:
    """The deltas of one answer, and the message that ended it (done or error)."""
    deltas = []
    while (message := receive(socket))["type"] == "delta":
        deltas.append(message["content"])
    return deltas, message


def usage_record(request_id: str) -> UsageRecord:
    return wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=15,
        what=f"usage record {request_id}",
    )


def test_an_answer_streams_in_deltas_then_done_billed_to_the_chosen_key(platform, member):
    chosen = member.keys[1]
    with playground(platform, member.session) as socket:
        send(socket, chat(chosen, max_tokens=16))
        deltas, done = answer(socket)

    assert done["type"] == "done", done
    assert len(deltas) > 1 and all(deltas)
    assert done["usage"]["completion_tokens"] == 16
    assert done["finish_reason"] == "length"
    assert done["ttft_ms"] > 0
    record = usage_record(done["request_id"])
    assert record.api_key_id == chosen.id  # the key picked, not the tenant's other one
    assert (record.status, record.endpoint, record.stream) == ("ok", "chat.completions", True)
    assert (record.prompt_tokens, record.completion_tokens) == (
        done["usage"]["prompt_tokens"],
        done["usage"]["completion_tokens"],
    )


def test_anonymous_and_other_sites_are_refused_at_the_handshake(platform, member):
    with pytest.raises(InvalidStatus) as anonymous, playground(platform, None):
        pass
    assert anonymous.value.response.status_code == 403
    # A page elsewhere cannot ride the user's session cookie.
    elsewhere = "http://evil.example"
    with (
        pytest.raises(InvalidStatus) as foreign,
        playground(platform, member.session, origin=elsewhere),
    ):
        pass
    assert foreign.value.response.status_code == 403


def test_another_tenants_key_is_not_found_like_a_key_that_does_not_exist(platform, member):
    other_key, _ = make_api_key(make_tenant())
    with playground(platform, member.session) as socket:
        refusals = []
        for key_id in (other_key.key_id, "nosuchkey", 42):
            send(socket, chat(key_id))
            refusals.append(receive(socket))
    for refusal in refusals:
        assert refusal["type"] == "error"
        assert (refusal["error"]["code"], refusal["error"]["param"]) == ("not_found", "key_id")
    assert refusals[0] == refusals[1]  # nothing tells the other tenant's key apart
    assert not UsageRecord.objects.filter(api_key=other_key).exists()


def test_bad_messages_get_errors_and_the_socket_still_answers(platform, member):
    key = member.keys[0]
    with playground(platform, member.session) as socket:
        send(socket, "not json")
        not_json = receive(socket)
        send(socket, "[1, 2]")
        not_an_object = receive(socket)
        send(socket, {"type": "shout"})
        wrong_type = receive(socket)
        # Checked by the pipeline, as /v1 checks it: a 400 in the platform's shape.
        send(socket, chat(key, messages="hello"))
        _, bad_body = answer(socket)
        send(socket, chat(key, max_tokens=200))
        send(socket, chat(key))  # while the first streams
        busy = None
        deltas, done = [], None
        while done is None:
            message = receive(socket)
            if message["type"] == "delta":
                deltas.append(message["content"])
            elif message["type"] == "error":
                busy = message
            else:
                done = message

    assert not_json["error"]["code"] == not_an_object["error"]["code"] == "invalid_json"
    assert (wrong_type["error"]["code"], wrong_type["error"]["param"]) == ("invalid_value", "type")
    assert bad_body["type"] == "error" and bad_body["error"]["param"] == "messages"
    assert busy is not None and busy["error"]["code"] == "conflict"
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 200
    assert len(deltas) > 1


def test_a_revoked_key_is_refused_by_the_pipeline(platform, member):
    key = api_key_revoke(key=member.keys[0])
    with playground(platform, member.session) as socket:
        send(socket, chat(key))
        deltas, refusal = answer(socket)
    assert deltas == []
    assert refusal["type"] == "error" and refusal["error"]["code"] == "api_key_revoked"


def test_leaving_stops_the_generation_and_bills_what_was_generated(platform, member):
    key = member.keys[0]
    with playground(platform, member.session) as socket:
        send(socket, chat(key, max_tokens=1500))
        first = receive(socket)  # the engine is generating
    assert first["type"] == "delta", first
    record = wait_for(
        lambda: UsageRecord.objects.filter(api_key=key).first(),
        timeout=20,
        what="the abandoned answer's usage",
    )
    assert record.status == "client_disconnected"
    assert 0 < record.completion_tokens < 1500
