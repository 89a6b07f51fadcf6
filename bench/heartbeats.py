"""What a node heartbeat costs the gateway process that serves it.

    .venv/bin/python bench/heartbeats.py [--count 1000]

Starts one gateway as bench/run.py does (its own database and Redis, pinned to core 0),
registers a node with the recorded 8 x H100 view (tests/inference/hardware), and sends
heartbeats one after another through the worker's own client (inference/platform_client.py),
each with an engine load and that GPU view, as a GPU worker sends them. Reports the gateway's
CPU per heartbeat (from /proc) and the round trip's p50 and p99. Nothing else runs, so the CPU
is the heartbeats' alone (less the idle gateway's, measured first and subtracted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import MODEL, Processes, _cores, _env, _wait, cpu_seconds, setup
from inference.hardware.detection import get_gpu_info
from inference.platform_client import PlatformClient
from inference.wire import EngineLoad, Heartbeat, Registration
from tests.inference.hardware.nvml_replay import H100_X8, replay
from tests.stack import free_port, gateway_argv

IDLE_SECONDS = 5  # the idle gateway's own CPU (its refresh loops), subtracted per second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--redis-db", type=int, default=12)
    args = parser.parse_args()

    env = _env(args.redis_db)
    credentials = setup(env)
    procs = Processes(env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        gateway = procs.start(
            "gateway", [*gateway_argv(port), "--log-level", "warning"], _cores()[0]
        )
        _wait(url + "/health")
        client = PlatformClient(url, credentials["token"])
        view = get_gpu_info(backend=replay(H100_X8)).to_dict()
        accepted = client.register(
            Registration(
                name="bench-heartbeats",
                url="http://127.0.0.1:1",
                model=MODEL,
                version="v1",
                served_model_name=MODEL,
                max_model_len=2048,
                resources=view,
            )
        )
        heartbeat = Heartbeat(
            status="up",
            engine=EngineLoad(num_requests_running=12, num_requests_waiting=3, kv_cache_usage=0.41),
            resources=view,
        )
        for _ in range(20):  # warm-up: connections, caches
            client.heartbeat(accepted.node_id, heartbeat)

        before = cpu_seconds([gateway.pid])
        time.sleep(IDLE_SECONDS)
        idle_per_second = (cpu_seconds([gateway.pid]) - before) / IDLE_SECONDS

        latencies = []
        started, before = time.perf_counter(), cpu_seconds([gateway.pid])
        for _ in range(args.count):
            sent = time.perf_counter()
            client.heartbeat(accepted.node_id, heartbeat)
            latencies.append((time.perf_counter() - sent) * 1000)
        elapsed = time.perf_counter() - started
        busy = cpu_seconds([gateway.pid]) - before - idle_per_second * elapsed
    finally:
        procs.stop()

    latencies.sort()
    print(
        f"{args.count} heartbeats (8-GPU view): gateway CPU "
        f"{busy / args.count * 1000:.2f} ms each; round trip p50 "
        f"{statistics.median(latencies):.2f} ms, p99 "
        f"{latencies[int(len(latencies) * 0.99)]:.2f} ms; idle gateway "
        f"{idle_per_second * 1000:.1f} ms CPU/s"
    )


if __name__ == "__main__":
    main()
