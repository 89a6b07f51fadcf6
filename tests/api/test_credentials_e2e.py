"""The two credentials never stand in for each other, through the running gateways: /v1 refuses
a management token, /api/v1 refuses an API key (both 401), each accepts its own."""

from __future__ import annotations

import pytest

from apps.keys.choices import MemberRole
from tests.api.conftest import as_caller
from tests.http import call
from tests.keys.factories import make_member, make_tenant

CHAT = {"model": "dmx-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture
def management_token(committed) -> str:
    return as_caller(make_member(make_tenant(), role=MemberRole.OWNER)).secret


def test_v1_refuses_a_management_token(platform, management_token):
    for api_url in platform.api_urls:
        for reply in (
            call("GET", api_url + "/models", key=management_token),
            call("POST", api_url + "/chat/completions", key=management_token, json_body=CHAT),
        ):
            assert reply.status == 401, reply.body
            assert reply.json()["error"]["code"] == "invalid_api_key"
        assert call("GET", api_url + "/models", key=platform.api_key).status == 200


def test_the_management_api_refuses_an_api_key(platform, management_token):
    for gateway in platform.stack.gateways:
        refused = call("GET", gateway + "/api/v1/keys", key=platform.api_key)
        assert refused.status == 401, refused.body
        assert "not a management credential" in refused.json()["error"]["message"]
        assert call("GET", gateway + "/api/v1/keys", key=management_token).status == 200
