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
