"""A worker's engine killed hard, or the worker and its engine together: nothing of vLLM is left
running, the restarted worker serves on the same port, and every request sent meanwhile is
billed once.

vLLM's API server starts its engine core and that core's worker; killed with -9 they used to
outlive it (with their memory: GPU memory on a GPU host), and a worker killed with -9 left vLLM
serving, so that its restart registered against the orphan and then failed: address in use.
"""

from __future__ import annotations

import os
import signal
import socket
import uuid
from pathlib import Path

from inference import proctree
from tests.conftest import TINY_CONTEXT, wait_until_served
from tests.faults import Sent, assert_recorded_once, send_chat
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.stack import wait_for

# vLLM exits within seconds of SIGTERM; a group still there after this was not stopped.
GONE_WITHIN = 45


def body(model: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "ignore_eos": True,
    }


def serve(platform, model: str, sent: list[Sent], key: str, count: int = 2) -> None:
    for _ in range(count):
        reply = send_chat(platform.api_url, key, body(model))
        assert reply.status == 200, reply
        sent.append(reply)


def restart(platform, model: str, port: int):
    """Start the worker again on `port`; return it once it has registered (until then the
    node's last heartbeats, from before the kill, still say it is up)."""
    worker = platform.stack.start_worker(
        model_name=model, node_token=platform.node_token, port=port
    )
    wait_for(
        lambda: "registered as node" in worker.log_tail(400) or not worker.alive(),
        timeout=180,
        what="the restarted worker to register",
    )
    wait_until_served(platform, model, worker)
    return worker


def exited(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it to collect its status."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pgid: int, members: list[int]) -> None:
    wait_for(
        lambda: not proctree.group_members(pgid) and all(exited(pid) for pid in members),
        timeout=GONE_WITHIN,
        what=f"vLLM's processes {members} to be gone",
    )


def test_killed_engine_and_killed_worker_leave_no_orphan_and_restart(platform, committed):
    model = f"dmx-crash-{uuid.uuid4().hex[:6]}"
    make_model(model, max_context_tokens=TINY_CONTEXT)
    api_key, key = make_api_key()
    sent: list[Sent] = []

    worker = platform.stack.start_worker(model_name=model, node_token=platform.node_token)
    wait_until_served(platform, model, worker)
    serve(platform, model, sent, key)

    # 1. vLLM's API server killed: the worker stops the rest of its tree, says so, and exits.
    engine = worker.engine_pid()
    members = proctree.group_members(engine)
    assert len(members) >= 2, "the API server and its engine core"
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: not worker.alive(), timeout=GONE_WITHIN, what="the worker to exit")
    assert worker.process.returncode == 1
    wait_gone(engine, members)
    sent.append(send_chat(platform.api_url, key, body(model)))  # no engine: refused, billed 0
    assert sent[-1].status in (502, 503)

    # 2. Restarted on the same port and run directory: serves.
    worker = restart(platform, model, worker.port)
    serve(platform, model, sent, key)

    # 3. The worker and vLLM's API server killed together, as a host's OOM killer might: the
    # engine core is left with nobody to tell it. The restarted worker finds it by the run
    # directory it carries in its environment, stops it, finds the port free, and serves.
    # (The worker alone killed: vLLM is told by its parent-death signal, tests/inference/
    # test_proctree.py.)
    engine = worker.engine_pid()
    members = proctree.group_members(engine)
    for pid in (worker.process.pid, engine):
        os.kill(pid, signal.SIGKILL)
    worker.process.wait(timeout=10)
    assert proctree.group_members(engine), "the engine core outlives them both"
    worker = restart(platform, model, worker.port)
    wait_gone(engine, members)
    assert "left by an earlier worker" in worker.log_tail(400)
    serve(platform, model, sent, key)
    last = worker.engine_pid()
    assert last != engine

    worker.stop()
    wait_gone(last, [])
    assert_recorded_once(sent, key=api_key)


def test_a_worker_refuses_a_port_that_already_answers(platform, committed):
    """Its health checks would reach the other server: it says so and exits instead."""
    model = f"dmx-port-{uuid.uuid4().hex[:6]}"
    make_model(model, max_context_tokens=TINY_CONTEXT)
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        worker = platform.stack.start_worker(
            model_name=model, node_token=platform.node_token, port=port
        )
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to give up")
    assert worker.process.returncode == 1
    assert "already answers" in worker.log_tail()
    assert worker.engine_pid() is None  # vLLM was never started
