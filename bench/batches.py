"""Batch interference: what a large batch running does to interactive requests.

    .venv/bin/python bench/batches.py                 # about 12 minutes; writes bench/results/
    .venv/bin/python bench/batches.py --rounds 1 --window 20   # a smoke run

One command starts the platform on this machine, on PostgreSQL (DMX_BENCH_DATABASE_URL, by
default a database of its own on 127.0.0.1) and Redis: a gateway, the main Celery worker (the
ledger), a batch worker, and two real vLLM workers (the tiny model on the CPU) serving one
model. Interactive requests arrive at a fixed rate (open loop: Poisson arrivals, streamed chat
completions), and each window measures their time to first token. Windows alternate, A B A B:
A with no batch, B with a large batch running (created before the window; its progress during
the window is counted). The table gives each kind's p50 and p95 TTFT per round, their medians
over the rounds, the ratio B/A, and the batch's lines answered per second.

On two cores the batch's engine work and its worker share the machine with the interactive
requests, which a GPU fleet (the batch workers on their own machines, the engines on GPUs)
does not: the ratio here is the pessimistic one.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    RESULTS,
    RUN_DIR,
    WORKER_PYTHON,
    Processes,
    _env,
    _wait,
    setup,
)
from tests.stack import (  # noqa: E402
    TINY_MODEL_VLLM_ARGS,
    batch_worker_argv,
    celery_argv,
    free_port,
    gateway_argv,
)

MODEL = "bench-model"
DATABASE = "dmx_bench_batches"


def database_url() -> str:
    url = os.environ.get("DMX_BENCH_DATABASE_URL")
    if url:
        return url
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        db.execute(f"CREATE DATABASE {DATABASE}")
    return f"postgres://postgres@127.0.0.1:5432/{DATABASE}"


def start(procs: Processes, env: dict, credentials: dict) -> str:
    """The platform and its two vLLM workers; returns the gateway's URL once both serve."""
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    cores = "0-1" if (os.cpu_count() or 1) >= 2 else "0"
    procs.start("gateway", gateway_argv(port), cores)
    _wait(gateway_url + "/health")
    procs.start("celery", celery_argv(RUN_DIR / "celerybeat-schedule"), cores, background=True)
    procs.start("batch-worker", batch_worker_argv(), cores)
    for name in ("a", "b"):
        procs.start(
            f"vllm-{name}",
            [
                str(WORKER_PYTHON),
                "-m",
                "inference.worker",
                "--model",
                str(ROOT / ".cache" / "models" / "dmx-tiny"),
                "--name",
                MODEL,
                "--port",
                str(free_port()),
                "--node-name",
                f"bench-{name}",
                "--platform-url",
                gateway_url,
                "--run-dir",
                str(RUN_DIR / f"vllm-{name}"),
                "--",
                *TINY_MODEL_VLLM_ARGS,
            ],
            cores,
            env=dict(
                env,
                DMX_NODE_TOKEN=credentials["token"],
                VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_CPU_OMP_THREADS_BIND="nobind",
                OMP_NUM_THREADS="1",
            ),
        )
    deadline = time.monotonic() + 600
    while _live_nodes(gateway_url, credentials["key"], env["DATABASE_URL"]) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the two vLLM workers did not come up in 10 minutes")
        time.sleep(2)
    return gateway_url


def _live_nodes(gateway_url: str, key: str, database: str) -> int:
    """Nodes that have registered and answer a request through the gateway: both must, or the
    windows would measure one."""
    with psycopg.connect(database.replace("postgres://", "postgresql://", 1)) as db:
        up = db.execute("SELECT count(*) FROM hardware_node WHERE status = 'up'").fetchone()[0]
    if up < 2:
        return up
    reply = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        timeout=60,
    )
    return up if reply.is_success else 0


async def interactive(gateway_url: str, key: str, *, rate: float, seconds: float, seed: int):
    """Streamed chat completions arriving at `rate` per second (Poisson) for `seconds`; returns
    each one's time to first token, seconds, and the count of failures."""
    rng = random.Random(seed)
    ttfts: list[float] = []
    failures = 0

    async def one(client: httpx.AsyncClient, n: int) -> None:
        nonlocal failures
        body = {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": f"Question {n}: write a haiku about the sea."}
            ],
            "max_tokens": 16,
            "stream": True,
        }
        started = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                if reply.status_code != 200:
                    failures += 1
                    return
                first = None
                async for line in reply.aiter_lines():
                    if first is None and line.startswith("data: ") and '"content"' in line:
                        first = time.perf_counter() - started
                if first is not None:
                    ttfts.append(first)
        except httpx.HTTPError:
            failures += 1

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=120) as client:
        tasks = []
        end = time.perf_counter() + seconds
        n = 0
        while (now := time.perf_counter()) < end:
            tasks.append(asyncio.create_task(one(client, n)))
            n += 1
            await asyncio.sleep(min(rng.expovariate(rate), max(end - now, 0)))
        await asyncio.gather(*tasks)
    return ttfts, failures


def create_batch(gateway_url: str, key: str, lines: int, seed: int) -> str:
    rng = random.Random(seed)
    rows = [
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Summarize item {i}: " + "lorem " * rng.randint(5, 60),
                        }
                    ],
                    "max_tokens": rng.choice((16, 32, 64)),
                },
            }
        )
        for i in range(lines)
    ]
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gateway_url, headers=headers, timeout=60) as client:
        upload = client.post(
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": ("batch.jsonl", io.BytesIO("\n".join(rows).encode()))},
        )
        upload.raise_for_status()
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        return created.json()["id"]


def batch_state(gateway_url: str, key: str, batch_id: str) -> dict:
    reply = httpx.get(
        f"{gateway_url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}
    )
    reply.raise_for_status()
    return reply.json()


def cancel(gateway_url: str, key: str, batch_id: str) -> None:
    httpx.post(
        f"{gateway_url}/v1/batches/{batch_id}/cancel", headers={"Authorization": f"Bearer {key}"}
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=60, help="seconds per window")
    parser.add_argument("--rate", type=float, default=2.0, help="interactive requests per second")
    parser.add_argument("--lines", type=int, default=3000, help="lines of each round's batch")
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--results", default="batches")
    args = parser.parse_args()

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    env = _env(args.redis_db)
    env.update(
        DATABASE_URL=database_url(),
        DMX_FILES_ROOT=str(RUN_DIR / "files"),
        DMX_BATCH_TICK_SECONDS="1",
        DMX_LOG_LEVEL="WARNING",
    )
    subprocess.run(
        ["redis-cli", "-n", str(args.redis_db), "FLUSHDB"], check=True, capture_output=True
    )
    credentials = setup(env)
    procs = Processes(env)
    rounds = []
    try:
        gateway_url = start(procs, env, credentials)
        key = credentials["key"]
        asyncio.run(interactive(gateway_url, key, rate=args.rate, seconds=10, seed=0))  # warm-up
        for number in range(args.rounds):
            quiet, failed_a = asyncio.run(
                interactive(gateway_url, key, rate=args.rate, seconds=args.window, seed=number)
            )
            batch_id = create_batch(gateway_url, key, args.lines, seed=number)
            _wait_running(gateway_url, key, batch_id)
            before = batch_state(gateway_url, key, batch_id)["request_counts"]["completed"]
            busy, failed_b = asyncio.run(
                interactive(gateway_url, key, rate=args.rate, seconds=args.window, seed=number)
            )
            after = batch_state(gateway_url, key, batch_id)["request_counts"]["completed"]
            cancel(gateway_url, key, batch_id)
            _wait_ended(gateway_url, key, batch_id)
            rounds.append(
                {
                    "a_p50": percentile(quiet, 0.5) * 1000,
                    "a_p95": percentile(quiet, 0.95) * 1000,
                    "b_p50": percentile(busy, 0.5) * 1000,
                    "b_p95": percentile(busy, 0.95) * 1000,
                    "a_n": len(quiet),
                    "b_n": len(busy),
                    "failed": failed_a + failed_b,
                    "batch_lines_per_s": (after - before) / args.window,
                }
            )
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        procs.stop()
    write(args, rounds)


def _wait_running(gateway_url: str, key: str, batch_id: str) -> None:
    deadline = time.monotonic() + 120
    while batch_state(gateway_url, key, batch_id)["request_counts"]["completed"] < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} did not start")
        time.sleep(0.5)


def _wait_ended(gateway_url: str, key: str, batch_id: str) -> None:
    deadline = time.monotonic() + 300
    while batch_state(gateway_url, key, batch_id)["status"] not in ("cancelled", "completed"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} did not end")
        time.sleep(0.5)


def write(args, rounds: list[dict]) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    median = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    lines = [
        f"# Batch interference ({datetime.now(UTC):%Y-%m-%d}, commit {commit})",
        "",
        f"`bench/batches.py --rounds {args.rounds} --window {args.window:g} --rate {args.rate:g} "
        f"--lines {args.lines}`: two vLLM CPU workers (tiny model), streamed interactive chat "
        f"completions at {args.rate:g}/s (Poisson), windows of {args.window:g} s alternating "
        "A (no batch) and B (a batch running). TTFT in ms. Batch settings: "
        f"DMX_BATCH_MAX_BUSY={os.environ.get('DMX_BATCH_MAX_BUSY', '0.5 (default)')}, "
        f"DMX_BATCH_CONCURRENCY={os.environ.get('DMX_BATCH_CONCURRENCY', '8 (default)')}.",
        "",
        "| round | A p50 | A p95 | B p50 | B p95 | B/A p95 | batch lines/s in B | failed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for number, r in enumerate(rounds, start=1):
        lines.append(
            f"| {number} | {r['a_p50']:.0f} | {r['a_p95']:.0f} | {r['b_p50']:.0f} | "
            f"{r['b_p95']:.0f} | {r['b_p95'] / r['a_p95']:.2f} | {r['batch_lines_per_s']:.1f} | "
            f"{r['failed']} |"
        )
    lines.append(
        f"| median | {median['a_p50']:.0f} | {median['a_p95']:.0f} | {median['b_p50']:.0f} | "
        f"{median['b_p95']:.0f} | {median['b_p95'] / median['a_p95']:.2f} | "
        f"{median['batch_lines_per_s']:.1f} | |"
    )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.results}.md").write_text(text)
    (RESULTS / f"{args.results}.json").write_text(json.dumps({"rounds": rounds}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
