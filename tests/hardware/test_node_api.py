"""The node protocol over HTTP: registration through Django's test client, heartbeats through
their ASGI endpoint (the e2e suite runs real workers against a real gateway)."""

import orjson
import pytest
from asgiref.sync import async_to_sync
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from apps.hardware.choices import NodeStatus
from apps.hardware.consumers import NodeHeartbeatEndpoint
from apps.hardware.models import Node
from apps.hardware.nodestate import NodeSnapshot, fleet_key, node_token_key
from apps.hardware.services import nodes_sync
from dmxplatform.redis_client import sync_redis
from inference.wire import TokenizerUpload, tokenizer_digest
from tests.hardware.factories import make_node_token
from tests.models.factories import make_model

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


@pytest.fixture
def token(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # published to Redis, as in life
        return make_node_token()[1]


@pytest.fixture
def token_committed(transactional_db):
    return make_node_token()


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
        "message": "Expected `int`, got `str`",
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


def call_heartbeat(node_id: int, body: bytes, *, token: str | None, method: str = "POST"):
    """POST a heartbeat to the ASGI endpoint the gateway serves it with; (status, headers, JSON).

    A fresh endpoint per call: each owns a Redis client for the event loop that serves it, and
    every call here runs on its own loop.
    """
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []

    scope = {
        "type": "http",
        "method": method,
        "path": f"/internal/v1/nodes/{node_id}/heartbeat",
        "headers": headers,
        "url_route": {"args": (), "kwargs": {"node_id": node_id}},
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    async_to_sync(NodeHeartbeatEndpoint())(scope, receive, send)
    start, reply = sent
    response = {**start, "body": reply["body"]}
    return response["status"], dict(response["headers"]), orjson.loads(response["body"])


@pytest.fixture
def registered(client, django_capture_on_commit_callbacks) -> int:
    """A node registered and published to Redis, as heartbeats find it."""
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/internal/v1/nodes/register", registration(), format="json")
    return response.json()["node_id"]


def live_state(node_id: int) -> NodeSnapshot:
    return NodeSnapshot.decode(sync_redis().hget(fleet_key(), str(node_id)))


def test_heartbeat_lands_in_redis_at_once_and_in_the_database_on_sync(registered, token):
    heartbeat = {
        "status": "draining",
        "engine": {"num_requests_running": 3, "num_requests_waiting": 1, "kv_cache_usage": 0.4},
        "resources": {"kind": "cpu", "cpu_count": 4},
    }
    status, _, body = call_heartbeat(registered, orjson.dumps(heartbeat), token=token)
    assert (status, body) == (
        200,
        {"node_id": registered, "status": "draining", "drained": False},
    )
    snapshot = live_state(registered)
    engine = snapshot.engine
    assert (snapshot.status, engine.num_requests_running, engine.num_requests_waiting) == (
        "draining",
        3,
        1,
    )
    # The row is the sync's to write: the heartbeat made no database write of its own.
    node = Node.objects.get(id=registered)
    assert (node.status, node.num_requests_running) == ("up", 0)

    assert nodes_sync() == 0
    node.refresh_from_db()
    assert (node.status, node.num_requests_running, node.num_requests_waiting) == ("draining", 3, 1)
    assert node.kv_cache_usage == pytest.approx(0.4)
    assert node.resources == {"kind": "cpu", "cpu_count": 4}
    assert node.last_heartbeat_at.timestamp() == pytest.approx(snapshot.heartbeat_at, abs=1e-5)


def test_a_token_cannot_report_for_another_tokens_node(
    registered, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        other = make_node_token("other")[1]
    status, _, body = call_heartbeat(registered, b'{"status": "down"}', token=other)
    assert (status, body["error"]["code"]) == (404, "node_not_found")
    assert live_state(registered).status == NodeStatus.UP


def heartbeats_counted(status: int) -> float:
    return REGISTRY.get_sample_value("dmx_node_heartbeats_total", {"status": str(status)}) or 0.0


def test_heartbeat_requires_a_node_token(registered, token):
    refused, accepted = heartbeats_counted(401), heartbeats_counted(200)
    status, headers, body = call_heartbeat(registered, b'{"status": "up"}', token=None)
    assert (status, body["error"]["code"]) == (401, "not_authenticated")
    assert headers[b"www-authenticate"] == b'Bearer realm="dmx-nodes"'
    assert call_heartbeat(registered, b'{"status": "up"}', token=token)[0] == 200
    # Operators see refused heartbeats (a revoked token) at /metrics.
    assert (heartbeats_counted(401), heartbeats_counted(200)) == (refused + 1, accepted + 1)


# An unknown token id is looked up in the database, from a thread with its own connection.
@pytest.mark.django_db(transaction=True)
def test_heartbeat_with_an_unknown_or_wrong_token_is_refused(registered, token):
    for wrong in ("dmx-node-abcdefgh_nope", token[: -len("secret")] + "secret"):
        status, headers, body = call_heartbeat(registered, b'{"status": "up"}', token=wrong)
        assert (status, body["error"]["code"]) == (401, "invalid_node_token")
        assert headers[b"www-authenticate"] == b'Bearer realm="dmx-nodes"'


def test_a_bad_heartbeat_is_400_naming_the_field(registered, token):
    status, _, body = call_heartbeat(registered, b'{"status": "up",', token=token)
    assert (status, body["error"]["code"]) == (400, "invalid_payload")
    status, _, body = call_heartbeat(
        registered,
        orjson.dumps({"status": "up", "engine": {"num_requests_running": "many"}}),
        token=token,
    )
    assert (status, body["error"]["code"]) == (400, "invalid_payload")
    assert body["error"]["param"] == "engine.num_requests_running"
    status, headers, body = call_heartbeat(registered, b"", token=token, method="GET")
    assert (status, headers[b"allow"]) == (405, b"POST")


@pytest.mark.django_db(transaction=True)
def test_a_node_redis_lost_is_found_in_the_database(token_committed):
    # Redis lost its live state (a flush, a failover): the heartbeat rebuilds it from the row.
    token, plaintext = token_committed
    node = APIClient()
    node.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    node_id = node.post("/internal/v1/nodes/register", registration(), format="json").json()[
        "node_id"
    ]
    sync_redis().delete(fleet_key(), node_token_key(token.token_id))
    status, _, body = call_heartbeat(node_id, b'{"status": "up"}', token=plaintext)
    assert (status, body) == (200, {"node_id": node_id, "status": "up", "drained": False})
    assert live_state(node_id).name == "unit-node-1"
