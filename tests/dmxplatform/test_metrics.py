"""/metrics: the fleet read from Redis at scrape time, closed to strangers, and summed across
gateway processes."""

from __future__ import annotations

import time

import orjson
import pytest

from apps.hardware.nodestate import fleet_key, fleet_resources_key
from apps.routing.breaker import breakers_key
from dmxplatform.redis_client import sync_redis
from tests.hardware.test_resources import h100_view
from tests.routing.factories import make_snapshot

# The scrape reads the models' targets and the quotas from the database.
# The fleet written here is this test's, apart from the e2e stack's.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


def samples(body: str, prefix: str) -> dict[str, float]:
    found = {}
    for line in body.splitlines():
        if line.startswith(prefix):
            name_labels, value = line.rsplit(" ", 1)
            found[name_labels] = float(value)
    return found


def publish(*snapshots, resources: dict | None = None, breakers: dict | None = None) -> None:
    redis = sync_redis()
    for snapshot in snapshots:
        redis.hset(fleet_key(), str(snapshot.id), snapshot.encode())
    for node_id, view in (resources or {}).items():
        redis.hset(fleet_resources_key(), str(node_id), orjson.dumps(view))
    for node_id, raw in (breakers or {}).items():
        redis.hset(breakers_key(), str(node_id), raw)


def test_the_platforms_histograms_are_exported(client):
    import apps.gateway.pipeline  # noqa: F401  (a gateway process imports it as it starts)

    body = client.get("/metrics").content.decode()
    for name in (
        "dmx_gateway_request_duration_seconds",
        "dmx_gateway_stage_seconds",
        "dmx_gateway_time_to_first_token_seconds",
        "dmx_routing_decision_seconds",
    ):
        assert f"# TYPE {name} histogram" in body
    # Refusal reasons are there before the first refusal, so that rate() sees the first one.
    assert 'dmx_gateway_admissions_refused_total{reason="quota"} 0.0' in body


def test_the_fleet_is_read_from_the_shared_state_at_scrape_time(client):
    fresh = make_snapshot(
        name="gpu-a", model="llama", num_requests_running=7, num_requests_waiting=2,
        kv_cache_usage=0.25,
    )  # fmt: skip
    lagging = make_snapshot(name="gpu-b", model="llama", heartbeat_at=time.time() - 30)
    drained = make_snapshot(name="gpu-c", model="llama", drained=True)
    opened_ms = int(time.time() * 1000)
    publish(
        fresh,
        lagging,
        drained,
        resources={fresh.id: h100_view()},
        breakers={lagging.id: f"open 3 {opened_ms}"},
    )

    found = samples(client.get("/metrics").content.decode(), "dmx_")
    a = '{model="llama",node="gpu-a",status="up"}'
    assert found["dmx_node_requests_running" + a] == 7
    assert found["dmx_node_requests_waiting" + a] == 2
    assert found["dmx_node_kv_cache_usage_ratio" + a] == 0.25
    assert found["dmx_node_heartbeat_age_seconds" + a] < 5
    assert found["dmx_node_up" + a] == 1
    b = '{model="llama",node="gpu-b",status="up"}'
    assert 29 < found["dmx_node_heartbeat_age_seconds" + b] < 60
    assert found["dmx_node_up" + b] == 0  # stale
    c = '{model="llama",node="gpu-c",status="up"}'
    assert found["dmx_node_drained" + c] == 1 and found["dmx_node_up" + c] == 0

    assert found['dmx_node_breaker_state{dmx_node_breaker_state="open",node="gpu-b"}'] == 1
    assert found['dmx_node_breaker_state{dmx_node_breaker_state="closed",node="gpu-b"}'] == 0
    assert found['dmx_node_breaker_state{dmx_node_breaker_state="closed",node="gpu-a"}'] == 1

    # The H100 recording's eight GPUs, each with its own readings, in bytes and ratios.
    view = h100_view()
    for gpu in view["gpus"]:
        labels = f'{{gpu="{gpu["index"]}",node="gpu-a"}}'
        assert found["dmx_gpu_memory_used_bytes" + labels] == gpu["memory_used_mb"] * 2**20
        assert found["dmx_gpu_memory_total_bytes" + labels] == gpu["memory_total_mb"] * 2**20
        assert found["dmx_gpu_utilization_ratio" + labels] == gpu["gpu_utilization"]
        assert found["dmx_gpu_temperature_celsius" + labels] == gpu["temperature_c"]
    assert not any("gpu-b" in name for name in found if name.startswith("dmx_gpu_"))


def test_strangers_get_404_and_a_bearer_token_opens_it(client, settings):
    stranger = {"REMOTE_ADDR": "203.0.113.7"}
    assert client.get("/metrics", **stranger).status_code == 404
    settings.DMX_METRICS_TOKEN = "scrape-secret"
    assert client.get("/metrics", **stranger).status_code == 404
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **stranger)
    assert wrong.status_code == 404
    right = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret", **stranger)
    assert right.status_code == 200 and b"dmx_gateway_stage_seconds" in right.content
    settings.DMX_METRICS_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    assert client.get("/metrics", **stranger).status_code == 200
    # Loopback is allowed only because the default says so.
    assert client.get("/metrics").status_code == 404


def test_quotas_near_exhaustion_are_exported_and_the_others_not(client):
    from django.utils import timezone

    from apps.billing.counters import period_bounds
    from apps.keys.ratelimit import quota_key
    from tests.keys.factories import make_api_key

    near, _ = make_api_key(token_quota=1000, token_quota_period="day")
    far, _ = make_api_key(token_quota=1000, token_quota_period="day")
    label, _, _ = period_bounds("day", timezone.now())
    sync_redis().set(quota_key(near.tenant_id, "key", near.id, label, ""), 950)
    sync_redis().set(quota_key(far.tenant_id, "key", far.id, label, ""), 100)

    found = samples(client.get("/metrics").content.decode(), "dmx_quota_used_ratio")
    near_labels = f'{{key="{near.key_id}",model="",period="day",tenant="{near.tenant.slug}"}}'
    assert found == {"dmx_quota_used_ratio" + near_labels: 0.95}
