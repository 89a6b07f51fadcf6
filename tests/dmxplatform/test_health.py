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
