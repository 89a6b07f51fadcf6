"""The fleet's figures for Prometheus (apps.routing.metrics), read through the hardware app's
fleet reader: an entry that does not decode costs its own figures, not the scrape's. (The
figures themselves, over /metrics: tests/dmxplatform/test_metrics.py.)"""

from __future__ import annotations

import orjson
import pytest

from apps.hardware.nodestate import fleet_key, fleet_resources_key
from apps.routing.metrics import FleetCollector
from dmxplatform.redis_client import sync_redis
from tests.hardware.test_resources import h100_view
from tests.routing.factories import make_snapshot

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")


def test_an_unreadable_entry_costs_only_its_own_figures(caplog):
    good = make_snapshot(name="gpu-ok")
    redis = sync_redis()
    redis.hset(fleet_key(), mapping={str(good.id): good.encode(), "999": b"{cut short"})
    redis.hset(
        fleet_resources_key(),
        mapping={str(good.id): orjson.dumps(h100_view()), "999": b"{cut short"},
    )

    families = {family.name: family for family in FleetCollector().collect()}

    running = families["dmx_node_requests_running"].samples
    assert [sample.labels["node"] for sample in running] == ["gpu-ok"]
    gpus = {sample.labels["gpu"] for sample in families["dmx_gpu_memory_used_bytes"].samples}
    assert len(gpus) == len(h100_view()["gpus"])
    assert "unreadable fleet entry" in caplog.text
