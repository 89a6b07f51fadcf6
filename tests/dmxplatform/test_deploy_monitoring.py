"""deploy/prometheus and deploy/grafana against the code: every query parses (PromQL's own
grammar, promql-parser), every recorded series they read is recorded, and every metric they
name is one the running platform exports, so that the two cannot drift apart."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import promql_parser
import pytest
import yaml
from django.utils import timezone

from apps.billing.counters import period_bounds
from apps.hardware.nodestate import fleet_key, fleet_resources_key
from apps.keys.ratelimit import quota_key
from apps.models.models import LlmModel
from dmxplatform.redis_client import sync_redis
from tests.conftest import BROKEN_MODEL, SERVED_MODELS
from tests.hardware.test_resources import h100_view
from tests.http import call
from tests.keys.factories import make_api_key
from tests.routing.factories import make_snapshot

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def rules() -> Iterator[dict]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every alert, recording rule and dashboard panel."""
    for rule in rules():
        yield rule.get("alert") or rule["record"], rule["expr"]
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name}: {panel['title']}", target["expr"]


def selected_names(node) -> Iterator[str]:
    """The metric names an expression's selectors read, walking promql-parser's tree."""
    name = getattr(node, "name", None)
    if isinstance(name, str) and hasattr(node, "matchers"):
        yield name
    for child in ("lhs", "rhs", "expr", "param", "vector_selector"):
        value = getattr(node, child, None)
        if value is not None and not isinstance(value, str | int | float):
            yield from selected_names(value)
    for arg in getattr(node, "args", None) or ():
        yield from selected_names(arg)


def named() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for where, expr in queries():
        for name in selected_names(promql_parser.parse(expr)):
            found.setdefault(name, set()).add(where)
    return found


def test_the_files_are_there_and_every_query_parses():
    assert len(RULE_FILES) == 2 and DASHBOARDS
    alerts = [rule["alert"] for rule in rules() if "alert" in rule]
    # What the on-call engineer asked for, each an alert.
    for wanted in (
        "DmxTimeToFirstTokenOverSlo", "DmxNodeDown", "DmxNodeHeartbeatLagging", "DmxBreakerOpen",
        "DmxGpuTemperatureHigh", "DmxLedgerBacklogGrowing", "DmxQuotaNearExhaustion",
    ):  # fmt: skip
        assert wanted in alerts
    assert len(list(queries())) > 40
    assert named()  # promql_parser.parse raised on any query it could not read


def test_recorded_series_they_read_are_recorded():
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    read = {name for name in named() if ":" in name}
    assert read <= recorded, read - recorded
    assert recorded - read == set(), "recording rules nothing reads"


@pytest.fixture
def everything_exported(platform, committed) -> Iterator[None]:
    """The state that makes every family show: traffic (streamed and not), a model with
    targets, a quota near its end, and a GPU node, a stand-in fed the recorded readings of an
    H100 node (no GPU here), for a model the stack does not serve."""
    model = LlmModel.objects.get(name=SERVED_MODELS[0])
    targets = model.sla_ttft_p95_ms, model.sla_latency_p95_ms
    LlmModel.objects.filter(id=model.id).update(sla_ttft_p95_ms=800, sla_latency_p95_ms=5000)
    key, _ = make_api_key(token_quota=1000, token_quota_period="day")
    label, _, _ = period_bounds("day", timezone.now())
    sync_redis().set(quota_key(key.tenant_id, "key", key.id, label, ""), 990)
    gpu_node = make_snapshot(
        id=990_001, name="h100-stand-in", model=BROKEN_MODEL, status="down",
        heartbeat_at=time.time(),
    )  # fmt: skip
    redis = sync_redis()
    redis.hset(fleet_key(), str(gpu_node.id), gpu_node.encode())
    redis.hset(fleet_resources_key(), str(gpu_node.id), orjson.dumps(h100_view()))
    try:
        for stream in (False, True):
            reply = call(
                "POST",
                platform.api_url + "/chat/completions",
                key=platform.api_key,
                json_body={
                    "model": SERVED_MODELS[0],
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 3,
                    "stream": stream,
                },
            )
            assert reply.status == 200
        yield
    finally:
        redis.hdel(fleet_key(), str(gpu_node.id))
        redis.hdel(fleet_resources_key(), str(gpu_node.id))
        LlmModel.objects.filter(id=model.id).update(
            sla_ttft_p95_ms=targets[0], sla_latency_p95_ms=targets[1]
        )


def exported(url: str) -> set[str]:
    """The metric names a /metrics page carries: its families (from # TYPE) and samples."""
    body = call("GET", url + "/metrics").body.decode()
    names = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_metric_they_name_is_exported_by_the_running_platform(everything_exported, platform):
    exported_names = exported(platform.url)
    missing = {
        name: sorted(places)
        for name, places in named().items()
        if ":" not in name and name not in exported_names
    }
    assert not missing, missing
    # And the histograms are read through their series, not as bare names.
    for name in named():
        if ":" not in name and HISTOGRAM_SERIES.sub("", name) != name:
            assert HISTOGRAM_SERIES.sub("", name) in exported_names
