"""The engine settings a worker fetches before it starts vLLM: node token only, the registry's
settings of an active version, a 404 in the API's error shape for any other."""

from __future__ import annotations

import urllib.parse

import pytest
from rest_framework.test import APIClient

from apps.models.services import model_version_save
from inference.wire import ENGINE_SETTINGS_PATH, EngineSettings
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


@pytest.fixture
def client(django_capture_on_commit_callbacks) -> APIClient:
    with django_capture_on_commit_callbacks(execute=True):  # the token published to Redis
        _, token = make_node_token()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def path(model: str, version: str) -> str:
    """As the worker's client quotes it (inference.platform_client)."""
    return ENGINE_SETTINGS_PATH.format(
        model=urllib.parse.quote(model, safe=""), version=urllib.parse.quote(version, safe="")
    )


def test_a_node_token_is_required():
    make_model("tooled")
    anonymous = APIClient()
    response = anonymous.get(path("tooled", "v1"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer dmx-node-abcdefgh_nope")
    response = anonymous.get(path("tooled", "v1"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_node_token"
    # An API key is not a node token.
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer dmx-abcdefgh_not-a-node")
    assert anonymous.get(path("tooled", "v1")).status_code == 401


def test_the_settings_of_a_version(client):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    make_model(
        "tooled",
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        chat_template=template,
    )
    response = client.get(path("tooled", "v1"))
    assert response.status_code == 200
    assert response.json() == {
        "kind": "generate",
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
        "chat_template": template,
    }
    # What the worker parses it into.
    assert EngineSettings.from_dict(response.json()).tool_call_parser == "hermes"


def test_an_embedding_model_without_settings(client):
    make_model("org/embedder", kind="embed", version="2024:01")  # a slash, a colon
    response = client.get(path("org/embedder", "2024:01"))
    assert response.status_code == 200
    assert response.json() == {
        "kind": "embed",
        "tool_call_parser": None,
        "reasoning_parser": None,
        "chat_template": None,
    }


def test_a_version_that_is_not_registered_is_a_404_in_the_apis_shape(client):
    _, version = make_model("tooled")
    for model, tag in (("tooled", "v9"), ("nobody", "v1")):
        response = client.get(path(model, tag))
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "model_version_not_found"
        assert error["param"] == "version"
        assert f"{model}@{tag}" in error["message"]
    version.is_active = False
    model_version_save(version=version)
    assert client.get(path("tooled", "v1")).status_code == 404
