import pytest

pytestmark = pytest.mark.django_db


def test_health_checks_database_and_redis(client):
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_health_reports_a_dead_redis(client, settings):
    from dmxplatform import redis_client

    redis_client.sync_redis.cache_clear()
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/health")
    finally:
        redis_client.sync_redis.cache_clear()
    assert response.status_code == 503
    assert response.json()["redis"].startswith("error")


def test_metrics_exposes_the_gateway_histogram(client):
    import dmxplatform.metrics  # noqa: F401  (the gateway process imports it with the pipeline)

    body = client.get("/metrics").content.decode()
    assert "# TYPE dmx_gateway_request_duration_seconds histogram" in body


def test_metrics_show_the_fleet_as_this_gateway_sees_it(client):
    """Heartbeat age and the load routing decides on, per node, read at scrape time."""
    import time

    from apps.routing.metrics import export_fleet
    from tests.routing.factories import make_fleet, make_snapshot

    fresh = make_snapshot(
        name="gpu-a", model="llama", num_requests_running=7, num_requests_waiting=2,
        kv_cache_usage=0.25,
    )  # fmt: skip
    lagging = make_snapshot(name="gpu-b", model="llama", heartbeat_at=time.time() - 30)
    fleet = make_fleet(fresh, lagging)
    fleet.inflight[fresh.id] = 3
    export_fleet(fleet)

    samples = {}
    for line in client.get("/metrics").content.decode().splitlines():
        if line.startswith("dmx_node_"):
            name_labels, value = line.rsplit(" ", 1)
            samples[name_labels] = float(value)
    labels = '{model="llama",node="gpu-a",status="up"}'
    assert samples["dmx_node_requests_running" + labels] == 7
    assert samples["dmx_node_requests_waiting" + labels] == 2
    assert samples["dmx_node_kv_cache_usage_ratio" + labels] == 0.25
    assert samples["dmx_node_gateway_inflight_requests" + labels] == 3
    assert samples["dmx_node_heartbeat_age_seconds" + labels] < 5
    lagging_labels = '{model="llama",node="gpu-b",status="up"}'
    assert 29 < samples["dmx_node_heartbeat_age_seconds" + lagging_labels] < 60
    assert samples["dmx_node_gateway_inflight_requests" + lagging_labels] == 0
