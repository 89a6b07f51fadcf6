"""The node protocol over HTTP, through Django's test client (the e2e suite uses real workers)."""

import pytest
from rest_framework.test import APIClient

from apps.hardware.choices import NodeStatus
from apps.hardware.fleet import NodeSnapshot, fleet_key
from apps.hardware.models import Node
from dmxplatform.redis_client import sync_redis
from inference.wire import TokenizerUpload, tokenizer_digest
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_redis_keys(private_redis):
    """These tests' Redis keys are their own (tests/conftest.py)."""


@pytest.fixture
def token():
    return make_node_token()[1]


@pytest.fixture
def client(token) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def registration(**overrides) -> dict:
    make_model("unit-model")
    return {
        "name": "unit-node-1",
        "url": "http://127.0.0.1:9999/",
        "model": "unit-model",
        "version": "v1",
        "served_model_name": "unit-model",
        "max_model_len": 2048,
        "resources": {"kind": "cpu", "cpu_count": 2},
        **overrides,
    }


def test_register_requires_a_valid_node_token():
    anonymous = APIClient()
    response = anonymous.post("/internal/v1/nodes/register", registration(), format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer dmx-node-abcdefgh_nope")
    response = anonymous.post("/internal/v1/nodes/register", registration(), format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_node_token"


def test_register_creates_the_node_and_publishes_it(client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/internal/v1/nodes/register", registration(), format="json")
    assert response.status_code == 201
    body = response.json()
    node = Node.objects.get(id=body["node_id"])
    assert node.status == NodeStatus.UP
    assert node.url == "http://127.0.0.1:9999"  # trailing slash dropped
    assert node.resources == {"kind": "cpu", "cpu_count": 2}
    assert body["heartbeat_seconds"] > 0 and body["tokenizer_wanted"] is False
    snapshot = NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node.id)))
    assert (snapshot.model, snapshot.version_tag, snapshot.status) == ("unit-model", "v1", "up")


def test_register_twice_updates_the_same_node(client):
    first = client.post("/internal/v1/nodes/register", registration(), format="json").json()
    again = client.post(
        "/internal/v1/nodes/register", registration(url="http://127.0.0.1:7777"), format="json"
    ).json()
    assert first["node_id"] == again["node_id"]
    assert Node.objects.get(id=first["node_id"]).url == "http://127.0.0.1:7777"


def test_unknown_model_version_is_404(client):
    response = client.post("/internal/v1/nodes/register", registration(version="v9"), format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_version_not_found"


def test_bad_payload_is_400_naming_the_field(client):
    response = client.post(
        "/internal/v1/nodes/register", registration(max_model_len="big"), format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "must be an integer",
        "type": "invalid_request_error",
        "param": "max_model_len",
        "code": "invalid_payload",
    }


def test_tokenizer_is_asked_for_once_then_linked(client):
    upload = TokenizerUpload(tokenizer_json='{"version": "1.0"}', chat_template="{{ x }}")
    sha = tokenizer_digest(upload)
    first = client.post(
        "/internal/v1/nodes/register", registration(tokenizer_sha256=sha), format="json"
    ).json()
    assert first["tokenizer_wanted"] is True
    wrong = client.put(f"/internal/v1/tokenizers/{'0' * 64}", upload.to_dict(), format="json")
    assert wrong.status_code == 400
    assert wrong.json()["error"]["code"] == "tokenizer_hash_mismatch"
    assert (
        client.put(f"/internal/v1/tokenizers/{sha}", upload.to_dict(), format="json").status_code
        == 201
    )
    again = client.post(
        "/internal/v1/nodes/register", registration(tokenizer_sha256=sha), format="json"
    ).json()
    assert again["tokenizer_wanted"] is False
    assert Node.objects.get(id=again["node_id"]).model_version.tokenizer_id == sha


def test_heartbeat_records_load(client):
    node_id = client.post("/internal/v1/nodes/register", registration(), format="json").json()[
        "node_id"
    ]
    heartbeat = {
        "status": "draining",
        "engine": {"num_requests_running": 3, "num_requests_waiting": 1, "kv_cache_usage": 0.4},
    }
    response = client.post(f"/internal/v1/nodes/{node_id}/heartbeat", heartbeat, format="json")
    assert response.status_code == 200
    node = Node.objects.get(id=node_id)
    assert (node.status, node.num_requests_running, node.num_requests_waiting) == ("draining", 3, 1)
    assert node.kv_cache_usage == pytest.approx(0.4)


def test_a_token_cannot_report_for_another_tokens_node(client):
    node_id = client.post("/internal/v1/nodes/register", registration(), format="json").json()[
        "node_id"
    ]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_node_token('other')[1]}")
    response = other.post(
        f"/internal/v1/nodes/{node_id}/heartbeat", {"status": "down"}, format="json"
    )
    assert response.status_code == 404
    assert Node.objects.get(id=node_id).status == NodeStatus.UP
