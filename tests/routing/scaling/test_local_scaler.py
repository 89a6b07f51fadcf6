"""The local scaler starts a real worker when the SLO is breached and stops it when load falls.

Runs against the session's platform (tests/conftest.py): real gateways, Celery and vLLM
workers. The scaled model has no worker of its own until the scaler starts one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.hardware.choices import NodeStatus
from apps.hardware.models import Node
from apps.models.models import LlmModel
from apps.routing.choices import ScalerBackend, ScalingAction, ScalingTrigger
from apps.routing.models import ScalingPolicy
from apps.routing.scaling.local import LocalProcessScaler, Replica
from apps.routing.scaling.services import scaling_evaluate
from apps.routing.scaling.slo import MIN_LATENCY_SAMPLES
from tests import stack
from tests.conftest import fleet_node
from tests.http import call
from tests.models.factories import make_model
from tests.routing.scaling.factories import record_requests

MODEL = "dmx-scaled"
LATENCY_TARGET_MS = 1000
# Far longer than the test: Celery's beat evaluates every active policy on its own schedule,
# and must not scale this one behind the test's back. The test moves its clock past it instead.
COOLDOWN_SECONDS = 3600
# The environment the e2e stack gives its vLLM workers on a shared CPU (tests/stack.py).
WORKER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
WORKER_ARGUMENTS = [
    *("--model", str(stack.TINY_MODEL_DIR), "--version", "v1", "--drain-timeout", "10"),
    *("--", *stack.TINY_MODEL_VLLM_ARGS),
]
# Short, like tests/stack.py's worker directories: vLLM's sockets live below it, and a Unix
# socket's path may not exceed 107 bytes.
STATE_DIR = stack.ROOT / ".run" / "test-scaled"
# A worker stops within its drain timeout (10 s here) plus vLLM's stop grace (15 s); the rest
# is for two shared cores.
STOP_TIMEOUT = 120


@pytest.fixture
def scaled(platform, committed, settings, monkeypatch) -> Iterator[ScalingPolicy]:
    """A policy for a model no worker serves, scaling local workers between 0 and 1."""
    model, _ = make_model(MODEL, max_context_tokens=2048)
    LlmModel.objects.filter(pk=model.pk).update(sla_latency_p95_ms=LATENCY_TARGET_MS)
    policy = ScalingPolicy(
        model=LlmModel.objects.get(pk=model.pk),
        backend=ScalerBackend.LOCAL,
        min_replicas=0,
        max_replicas=1,
        breaches_to_scale_out=1,
        calm_to_scale_in=1,
        cooldown_seconds=COOLDOWN_SECONDS,
        worker_arguments=WORKER_ARGUMENTS,
    )
    policy.full_clean()
    policy.save()
    settings.DMX_SCALING_STATE_DIR = STATE_DIR
    settings.DMX_SCALING_PLATFORM_URL = platform.url
    settings.DMX_SCALING_NODE_TOKEN = platform.node_token
    for name, value in WORKER_ENV.items():
        monkeypatch.setenv(name, value)
    scaler = LocalProcessScaler.from_policy(policy)
    try:
        yield policy
    finally:
        _stop_all(scaler)
        policy.delete()


def _stop_all(scaler: LocalProcessScaler) -> None:
    """Stop what the test started, however it ended: SIGTERM, then SIGKILL with the engine."""
    scaler.scale_to(0)
    with contextlib.suppress(TimeoutError):
        stack.wait_for(lambda: not scaler.replicas(), timeout=STOP_TIMEOUT, what="workers to stop")
    for replica in scaler.replicas():
        for pid in (_engine_pid(replica), replica.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


def _engine_pid(replica: Replica) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((Path(replica.run_dir) / "vllm.pid").read_text())
    return None


def _log(scaler: LocalProcessScaler, replica: Replica) -> str:
    path = scaler.state_dir / f"{replica.port}.log"
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-40:])
    return ""


def _listed(platform) -> bool:
    reply = call("GET", platform.api_url + "/models", key=platform.api_key)
    return reply.status == 200 and any(m["id"] == MODEL for m in reply.json()["data"])


def test_breach_starts_a_worker_that_serves_and_calm_stops_it(platform, scaled):
    scaler = LocalProcessScaler.from_policy(scaled)
    assert scaler.current_replicas() == 0
    now = timezone.now()
    slow = [LATENCY_TARGET_MS * 5.0] * MIN_LATENCY_SAMPLES

    # One transaction: Celery's beat, evaluating the same policy, waits on its row lock and
    # then finds the cooldown running, so this evaluation is the one that decides.
    with transaction.atomic():
        record_requests(MODEL, slow, at=now - timedelta(seconds=30))
        out = scaling_evaluate(policy_id=scaled.id, trigger=ScalingTrigger.OPERATOR, now=now)

    assert (out.action, out.from_replicas, out.to_replicas) == (ScalingAction.SCALE_OUT, 0, 1)
    assert out.pk is not None and out.figures["latency_p95_ms"] > LATENCY_TARGET_MS
    (replica,) = scaler.replicas()
    assert scaler.current_replicas() == 1

    def served() -> bool:
        if not scaler.replicas():
            pytest.fail(f"the scaled worker exited:\n{_log(scaler, replica)}")
        return _listed(platform)

    stack.wait_for(served, timeout=stack.WORKER_START_TIMEOUT, interval=0.5, what="the new node")
    assert Node.objects.get(name=replica.node_name).status == NodeStatus.UP

    reply = call(
        "POST",
        platform.api_url + "/chat/completions",
        key=platform.api_key,
        json_body={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        },
    )
    assert reply.status == 200, reply.body
    request_id = reply.headers["x-request-id"]
    record = stack.wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=30,
        what="the request's usage record",
    )
    assert (record.model, record.node) == (MODEL, replica.node_name), "served by the new worker"

    # Past the cooldown, with no request in the window and nothing waiting: calm.
    later = timezone.now() + timedelta(seconds=COOLDOWN_SECONDS + 1)
    calm = scaling_evaluate(policy_id=scaled.id, trigger=ScalingTrigger.OPERATOR, now=later)

    assert (calm.action, calm.from_replicas, calm.to_replicas) == (ScalingAction.SCALE_IN, 1, 0)
    assert scaler.current_replicas() == 0, "a stopping worker is not counted"
    stack.wait_for(lambda: not scaler.replicas(), timeout=STOP_TIMEOUT, what="the worker to exit")
    with pytest.raises(ProcessLookupError):
        os.kill(replica.pid, 0)
    snapshot = fleet_node(replica.node_name)
    assert snapshot is not None and snapshot.status == NodeStatus.DOWN, "it reported itself down"
    stack.wait_for(  # the row follows the live state on Celery's next node sync
        lambda: Node.objects.get(name=replica.node_name).status == NodeStatus.DOWN,
        timeout=settings.DMX_NODE_STALE_CHECK_SECONDS + 2,
        what="the Node row to follow",
    )
    stack.wait_for(lambda: not _listed(platform), timeout=30, what="the gateway to drop the model")
