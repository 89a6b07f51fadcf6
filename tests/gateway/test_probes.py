"""/livez and /readyz: a gateway is ready while Redis answers and its fleet state is fresh, and
stays ready without PostgreSQL (serving goes on, the ledger waits in Redis); /health, which asks
the database too, is for people, not for load balancers."""

from __future__ import annotations

from tests.faults import OwnRedis
from tests.http import call
from tests.stack import wait_for


def test_a_gateway_stays_ready_while_postgresql_is_away(platform):
    for url in platform.stack.gateways:
        ready = call("GET", url + "/readyz")
        assert ready.status == 200 and ready.json()["redis"] == "ok"
        assert ready.json()["fleet_state_age_seconds"] < 5
    platform.database.cut()
    try:
        assert call("GET", platform.url + "/health").status == 503  # the database is away
        for url in platform.stack.gateways:
            assert call("GET", url + "/readyz").status == 200
            assert call("GET", url + "/livez").status == 200
    finally:
        platform.database.restore()


def test_a_gateway_without_redis_is_unready_and_alive(platform, tmp_path):
    redis = OwnRedis(tmp_path / "redis").start()
    gateway, url = platform.stack.spare_gateway("gateway-probes", settings={"REDIS_URL": redis.url})
    try:
        wait_for(lambda: call("GET", url + "/readyz").status == 200, timeout=10, what="ready")
        redis.kill()
        unready = call("GET", url + "/readyz")
        assert unready.status == 503 and unready.json()["status"] == "unready"
        assert unready.json()["redis"].startswith("error")
        assert call("GET", url + "/livez").json() == {"status": "ok"}
        assert call("POST", url + "/livez").status == 405
    finally:
        gateway.stop()
        redis.kill()
