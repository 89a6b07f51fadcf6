"""The gateway benchmark: what the gateway adds to a request, with every feature switched on.

    .venv/bin/python bench/run.py            # the full run, about 6 minutes; writes bench/results/
    .venv/bin/python bench/run.py --quick    # a smoke run of every path, seconds per point
    .venv/bin/python bench/run.py --soak 600 --profile 10   # plus memory soak and profile
    .venv/bin/python bench/run.py --no-vllm --ttft-ms 20 --tpot-ms 5 --results paced
                                             # an upstream paced like a GPU engine
    .venv/bin/python bench/run.py --litellm  # also LiteLLM's proxy at every point, the yardstick
                                             # of the targets (bench/setup_litellm.sh first)
    .venv/bin/python bench/run.py --no-vllm --litellm --portkey --rounds 3
                                             # and Portkey's gateway (bench/setup_portkey.sh),
                                             # each measured three times per point, in turn
    .venv/bin/python bench/run.py --no-vllm --otlp --results tracing-on
                                             # every request traced, to a sink (bench/otlp_sink.py)
    .venv/bin/python bench/run.py --no-vllm --no-points --billing --results billing
                                             # budgets and balances on against off, side by side

One command starts everything on this machine: a fast fake upstream (bench/upstream.py), an
inference worker attached to it (so the gateway sees a registered node with heartbeats), the
gateway (one uvicorn process) and Celery. The key has rate limits, token limits, a concurrency
limit and a quota; 10,000 sensitive terms are loaded; prompts are classified and counted with
the model's tokenizer; usage is recorded. Each point is measured straight against the upstream
and through the gateway, back to back, at several concurrencies, streamed and not; the gateway's
CPU time comes from its own accounting in /proc. Then the same against a real vLLM worker with
the tiny model, for tokens per second. Results are printed and written as markdown and JSON.

With two cores, the gateway gets core 0 and everything else core 1 (`taskset`), so the
gateway's figures are not disturbed by the load generator or the upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import litellm_proxy, loadgen, portkey_gateway  # noqa: E402
from inference.proctree import group_members  # noqa: E402
from tests.stack import (  # noqa: E402
    PLATFORM_SETTINGS,
    TINY_MODEL_VLLM_ARGS,
    celery_argv,
    free_port,
    gateway_argv,
)

RUN_DIR = ROOT / ".run" / "bench"
RESULTS = ROOT / "bench" / "results"
PYTHON = ROOT / ".venv" / "bin" / "python"
WORKER_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MODEL = "bench-model"
REDIS_PREFIX = "dmxbench"
# apps.billing.ledger.USAGE_STREAM's one stream with the default single request-store shard.
USAGE_STREAM_KEY = f"{REDIS_PREFIX}:{{s0}}:usage:stream"
DRAIN_TIMEOUT = 300  # seconds the ledger gets to drain a point's usage events
# Granian, for --granian only (bench/setup_granian.sh): the platform does not depend on it.
GRANIAN_LIB = RUN_DIR / "granian"


def _env(redis_db: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=PLATFORM_SETTINGS,  # not the suite's, when a test runs it
        DMX_DEBUG="1",
        DJANGO_SECRET_KEY="bench",
        DMX_KEY_PEPPER="bench-pepper",
        DATABASE_URL=os.environ.get(
            "DMX_BENCH_DATABASE_URL", f"sqlite:///{RUN_DIR / 'db.sqlite3'}"
        ),
        REDIS_URL=f"redis://127.0.0.1:6379/{redis_db}",
        DMX_REDIS_PREFIX=REDIS_PREFIX,
        DMX_HEARTBEAT_SECONDS="1",
        DMX_LOG_LEVEL="WARNING",
        HF_HUB_OFFLINE="1",
    )
    return env


def _cores() -> tuple[str, str]:
    """Cores for the gateway and for everything else; the same core when there is one."""
    count = os.cpu_count() or 1
    return ("0", "1") if count >= 2 else ("0", "0")


class Processes:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.started: list[subprocess.Popen] = []

    def start(
        self,
        name: str,
        argv: list[str],
        core: str,
        env: dict[str, str] | None = None,
        *,
        background: bool = False,
        cwd: Path = ROOT,
    ):
        """Start a process pinned to `core`. A background one (Celery, the worker's heartbeat)
        runs under SCHED_IDLE, so that on two cores the upstream and the load generator it
        shares a core with come first (not enough for Celery's flush: see LedgerPause)."""
        log = (RUN_DIR / f"{name}.log").open("wb")
        idle = ["chrt", "--idle", "0"] if background else []
        process = subprocess.Popen(
            [*idle, "taskset", "-c", core, *argv],
            cwd=cwd,
            env=env or self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)


def _wait(url: str, *, key: str | None = None, timeout: float = 60, contains: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url)
            if key:
                request.add_header("Authorization", f"Bearer {key}")
            with urllib.request.urlopen(request, timeout=2) as response:
                if contains in response.read().decode():
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def setup(env: dict[str, str], *, workload_keys: Path | None = None) -> dict[str, str]:
    """Migrate the bench database; create the key, model, node token and terms (and with
    `workload_keys`, the realistic workload's keys, written there)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(PYTHON), "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [
            str(WORKER_PYTHON),
            "-m",
            "inference.tiny_model",
            str(ROOT / ".cache" / "models" / "dmx-tiny"),
        ],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = subprocess.run(
        [
            str(PYTHON),
            "bench/setup_platform.py",
            *(["--workload", str(workload_keys)] if workload_keys else []),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU of processes and their waited-for children, from /proc. A process
    that ended since its pid was listed is skipped: once reaped, its time is its parent's."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass(frozen=True)
class Yardstick:
    """Another gateway measured at every point beside this one, against the same upstream: its
    URL, key, the headers that route a request to the upstream, and its processes' PIDs (for
    its CPU)."""

    name: str  # the points' key: "litellm", "portkey"
    label: str  # as the tables name it
    url: str
    key: str | None
    pids: list[int]
    headers: dict[str, str] = field(default_factory=dict)


def measure(
    url: str,
    key: str | None,
    *,
    stream: bool,
    concurrency: int,
    tokens: int,
    warmup: float,
    duration: float,
    cpu_pids: list[int] | None = None,
    headers: dict[str, str] | None = None,
) -> dict:
    body = loadgen.request_body(model=MODEL, stream=stream, tokens=tokens)
    import uvloop

    load = dict(concurrency=concurrency, warmup=0, headers=headers)
    uvloop.run(loadgen.run(url, key, body, duration=warmup, **load))
    before = cpu_seconds(cpu_pids) if cpu_pids else 0.0
    result = uvloop.run(loadgen.run(url, key, body, duration=duration, **load))
    if cpu_pids:
        used = cpu_seconds(cpu_pids) - before
        result["cpu_ms_per_request"] = used * 1000 / max(result["requests"], 1)
        result["cpu_busy"] = used / duration
    return result


class LedgerPause:
    """Stop the Celery worker (the ledger's drain into the database) while a point is measured,
    and let it drain what the point appended before the next one.

    On two cores Celery shares one with the upstream and the load generator; its flush every two
    seconds (a thousand rows into the database) then lands on the upstream's latency and
    doubled the gateway's p99 at concurrency 1, even at the idle scheduling class. In
    production it runs on machines of its own. The gateway still appends every usage event to
    the durable stream inside its settle script, so usage recording stays on; `--ledger-live`
    measures with the drain running."""

    def __init__(self, celery: subprocess.Popen | None, redis_db: int) -> None:
        self.celery = celery
        self.redis_db = redis_db

    def __enter__(self) -> None:
        if self.celery is not None:
            os.killpg(self.celery.pid, signal.SIGSTOP)

    def __exit__(self, *exc) -> None:
        if self.celery is None:
            return
        os.killpg(self.celery.pid, signal.SIGCONT)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self._buffered():
            if time.monotonic() > deadline:
                print(f"the ledger did not drain within {DRAIN_TIMEOUT} s", flush=True)
                return
            time.sleep(0.5)

    def _buffered(self) -> int:
        with redis.Redis(host="127.0.0.1", port=6379, db=self.redis_db) as client:
            return client.xlen(USAGE_STREAM_KEY)


def _points(args):
    """Each point (streamed or not, at each concurrency) with measure()'s arguments for it."""
    for stream in (False, True):
        for concurrency in args.concurrency:
            yield (
                stream,
                concurrency,
                dict(
                    stream=stream,
                    concurrency=concurrency,
                    tokens=args.tokens,
                    warmup=args.warmup,
                    duration=args.duration,
                ),
            )


def _turns(sides: list[str], rounds: int):
    """`rounds` windows of each side, in an order that rotates every round (two sides: A B B A
    A B...), so that each takes each place and the machine's drift falls on all alike."""
    for window in range(rounds):
        turn = window % len(sides)
        for side in sides[turn:] + sides[:turn]:
            yield window, side


def fake_upstream_points(
    args,
    env,
    key: str,
    gateway_pid: int,
    upstream_url: str,
    gateway_url: str,
    ledger: LedgerPause,
    yardsticks: list[Yardstick],
) -> list[dict]:
    """Direct, then through the gateway and each yardstick (--litellm, --portkey), at each
    point. With --rounds N each is measured N times, in an order that rotates every round so
    that each takes each place (the machine drifts); the point keeps the medians, the CPU's
    range and every round."""
    rows = []
    gateway = Yardstick("gateway", "DMX", gateway_url, key, [gateway_pid])
    targets = {target.name: target for target in (gateway, *yardsticks)}
    for stream, concurrency, common in _points(args):
        direct = measure(upstream_url + "/v1/chat/completions", None, **common)
        rounds: dict[str, list[dict]] = {side: [] for side in targets}
        for _, side in _turns(list(targets), args.rounds):
            target = targets[side]
            # The gateway's usage drain waits while it is measured, as in every point.
            with ledger if side == "gateway" else contextlib.nullcontext():
                result = measure(
                    target.url + "/v1/chat/completions",
                    target.key,
                    cpu_pids=target.pids,
                    headers=target.headers,
                    **common,
                )
            rounds[side].append(result)
        row = {"stream": stream, "concurrency": concurrency, "direct": direct}
        row.update({side: _median_result(results) for side, results in rounds.items()})
        row["rounds"] = rounds
        rows.append(row)
        print(_row_text(rows[-1], yardsticks), flush=True)
    return rows


def _median_result(results: list[dict]) -> dict:
    """One point's rounds as one: the median of each figure, the CPU's range, counts summed."""
    if len(results) == 1:
        return results[0]
    merged = {
        name: _median([result[name] for result in results])
        for name, value in results[0].items()
        if isinstance(value, float)
    }
    merged["requests"] = sum(result["requests"] for result in results)
    merged["errors"] = sum(result["errors"] for result in results)
    merged["statuses"] = {}
    for result in results:
        for status, count in result["statuses"].items():
            merged["statuses"][status] = merged["statuses"].get(status, 0) + count
    cpu = [result["cpu_ms_per_request"] for result in results if "cpu_ms_per_request" in result]
    if cpu:
        merged["cpu_ms_range"] = [min(cpu), max(cpu)]
    return merged


def _row_text(row: dict, yardsticks: list[Yardstick]) -> str:
    d, g = row["direct"], row["gateway"]
    return (
        f"{'stream' if row['stream'] else 'json  '} C={row['concurrency']:<3} "
        f"direct {d['rps']:8.0f} rps p50 {d['p50_ms']:6.2f} p99 {d['p99_ms']:6.2f} | "
        f"gateway {g['rps']:8.0f} rps p50 {g['p50_ms']:6.2f} p99 {g['p99_ms']:6.2f} "
        f"cpu {g['cpu_ms_per_request']:.3f} ms/req statuses {g['statuses']}"
    ) + "".join(
        f" | {y.name} {row[y.name]['rps']:6.0f} rps p50 {row[y.name]['p50_ms']:6.2f} "
        f"cpu {row[y.name]['cpu_ms_per_request']:.2f} ms/req statuses {row[y.name]['statuses']}"
        for y in yardsticks
    )


def billing_points(
    args, keys: dict[str, str], gateway_pid: int, upstream_url: str, gateway_url: str, ledger
) -> list[dict]:
    """Budgets and balances on against off, in one gateway: key A (postpaid, no budget: no
    money rule) and key B (the same limits, in a prepaid tenant with a balance, a hard monthly
    tenant budget and a hard daily key budget, never reached: three money rules, so no
    admission lease) in alternate windows at C=1, A B B A A B..., so that the machine's drift
    falls on both alike; the upstream alone once first, for scale."""
    rows = []
    for stream in (False, True):
        common = dict(
            stream=stream,
            concurrency=1,
            tokens=args.tokens,
            warmup=args.warmup,
            duration=args.duration,
        )
        row = {
            "stream": stream,
            "direct": measure(upstream_url + "/v1/chat/completions", None, **common),
            "A": [],
            "B": [],
        }
        for window, side in _turns(["A", "B"], args.billing_rounds):
            with ledger:
                stages = stage_seconds(gateway_url)
                result = measure(
                    gateway_url + "/v1/chat/completions",
                    keys[side],
                    cpu_pids=[gateway_pid],
                    **common,
                )
                result["stage_ms"] = stage_ms(stages, stage_seconds(gateway_url))
            row[side].append(result)
            print(
                f"billing {'stream' if stream else 'json  '} window {window} key {side}: "
                f"{result['rps']:6.0f} rps p50 {result['p50_ms']:6.2f} "
                f"p99 {result['p99_ms']:6.2f} cpu {result['cpu_ms_per_request']:.3f} ms/req "
                f"limits {result['stage_ms'].get('limits', 0):.3f} ms "
                f"statuses {result['statuses']}",
                flush=True,
            )
        row["summary"] = _ab_summary(row)
        rows.append(row)
    return rows


def server_points(
    args, key: str, servers: dict[str, tuple[str, list[int]]], upstream_url: str, ledger
) -> list[dict]:
    """The same gateway under two ASGI servers (`servers`: A and B, each a URL and the PIDs of
    its processes), at each point in alternate windows, A B B A..., as billing_points does."""
    rows = []
    for stream, concurrency, common in _points(args):
        row = {
            "stream": stream,
            "concurrency": concurrency,
            "direct": measure(upstream_url + "/v1/chat/completions", None, **common),
            "A": [],
            "B": [],
        }
        for window, side in _turns(["A", "B"], args.server_rounds):
            url, pids = servers[side]
            with ledger:
                result = measure(url + "/v1/chat/completions", key, cpu_pids=pids, **common)
            row[side].append(result)
            print(
                f"server {side} {'stream' if stream else 'json  '} C={concurrency} "
                f"window {window}: {result['rps']:6.0f} rps p50 {result['p50_ms']:6.2f} "
                f"cpu {result['cpu_ms_per_request']:.3f} ms/req "
                f"statuses {result['statuses']}",
                flush=True,
            )
        row["summary"] = _ab_summary(row)
        rows.append(row)
    return rows


def server_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"The gateway under uvicorn (A, as config.serve runs it) and under Granian "
        f"{meta['granian']} (B: ASGI interface, uvloop, one worker), side by side on the same "
        f"core, upstream and key; {meta['server_rounds']} windows of each, alternating A B B "
        f"A..., {meta['duration']} s each after {meta['warmup']} s of warm-up. Medians over "
        "the windows; B/A is the median over adjacent pairs. CPU counts every process of each "
        "server.",
        "",
        "| mode | C | upstream rps | A rps | B rps | A added p50 ms | B added p50 ms "
        "| A CPU ms/req | B CPU ms/req | CPU B/A |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s, direct = row["summary"], row["direct"]
        p50, cpu = s["p50_ms"], s["cpu_ms_per_request"]
        lines.append(
            f"| {'stream' if row['stream'] else 'non-stream'} | {row['concurrency']} "
            f"| {direct['rps']:.0f} | {s['rps']['A']:.0f} | {s['rps']['B']:.0f} "
            f"| {p50['A'] - direct['p50_ms']:.2f} | {p50['B'] - direct['p50_ms']:.2f} "
            f"| {cpu['A']:.3f} | {cpu['B']:.3f} | {cpu['B/A']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def stage_seconds(gateway_url: str) -> dict[str, tuple[float, float]]:
    """The gateway's dmx_gateway_stage_seconds, per stage (sum, count), from its /metrics."""
    with urllib.request.urlopen(gateway_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        for suffix, index in (("_sum{", 0), ("_count{", 1)):
            if line.startswith("dmx_gateway_stage_seconds" + suffix):
                stage = line.split('stage="', 1)[1].split('"', 1)[0]
                totals.setdefault(stage, [0.0, 0.0])[index] += float(line.rsplit(" ", 1)[1])
    return {stage: (total, count) for stage, (total, count) in totals.items()}


def stage_ms(before: dict, after: dict) -> dict[str, float]:
    """Each stage's mean in milliseconds between two stage_seconds() readings."""
    means = {}
    for stage, (total, count) in after.items():
        old_total, old_count = before.get(stage, (0.0, 0.0))
        if count > old_count:
            means[stage] = (total - old_total) * 1000 / (count - old_count)
    return means


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _ab_summary(row: dict) -> dict:
    """Medians over the windows, and of the differences and ratios of each A window and the B
    window measured next to it (the pairs share the machine's state of the moment)."""
    pairs = list(zip(row["A"], row["B"], strict=True))
    summary = {"windows": len(pairs)}
    figures = {
        "p50_ms": lambda r: r["p50_ms"],
        "p99_ms": lambda r: r["p99_ms"],
        "cpu_ms_per_request": lambda r: r["cpu_ms_per_request"],
        "rps": lambda r: r["rps"],
        "limits_ms": lambda r: r.get("stage_ms", {}).get("limits", 0.0),
        "settle_ms": lambda r: r.get("stage_ms", {}).get("settle", 0.0),
    }
    for name, value in figures.items():
        differences = [value(b) - value(a) for a, b in pairs]
        summary[name] = {
            "A": _median([value(a) for a, _ in pairs]),
            "B": _median([value(b) for _, b in pairs]),
            "B-A": _median(differences),
            "B/A": _median([value(b) / value(a) if value(a) else 0.0 for a, b in pairs]),
            "B-A range": [min(differences), max(differences)],
        }
    return summary


def billing_markdown(rows: list[dict], meta: dict) -> str:
    leases = "admission leases" if meta["leases"] else "admission leases off for both keys"
    lines = [
        "Budgets and balances, on against off, side by side in one gateway at C=1: key A "
        f"postpaid with no budget (no money rule; {leases}), key B in a prepaid tenant with a "
        "balance, a hard monthly tenant budget and a hard daily key budget, none ever reached "
        "(three money rules in the same admission and settle scripts, never leased); "
        f"{meta['billing_rounds']} windows of each, alternating A B B A..., {meta['duration']} s "
        f"each after {meta['warmup']} s of warm-up. Medians over the windows; B-A and B/A are "
        "medians over adjacent pairs (range of B-A in brackets). `limits` is the gateway's own "
        "mean time in the admission stage (dmx_gateway_stage_seconds, warm-up included).",
        "",
        "| mode | upstream p50 ms | A p50 ms | B p50 ms | added p50 B-A ms | p50 B/A "
        "| A CPU ms/req | B CPU ms/req | added CPU B-A ms | CPU B/A | A limits ms | B limits ms "
        "| A rps | B rps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["summary"]
        p50, cpu, limits = s["p50_ms"], s["cpu_ms_per_request"], s["limits_ms"]
        lines.append(
            f"| {'stream' if row['stream'] else 'non-stream'} | {row['direct']['p50_ms']:.2f} "
            f"| {p50['A']:.2f} | {p50['B']:.2f} "
            f"| {p50['B-A']:+.2f} [{p50['B-A range'][0]:+.2f}, {p50['B-A range'][1]:+.2f}] "
            f"| {p50['B/A']:.2f} | {cpu['A']:.3f} | {cpu['B']:.3f} "
            f"| {cpu['B-A']:+.3f} [{cpu['B-A range'][0]:+.3f}, {cpu['B-A range'][1]:+.3f}] "
            f"| {cpu['B/A']:.2f} | {limits['A']:.3f} | {limits['B']:.3f} "
            f"| {s['rps']['A']:.0f} | {s['rps']['B']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _pacing(meta: dict) -> str:
    if not (meta["ttft_ms"] or meta["tpot_ms"]):
        return ""
    return (
        f", the upstream paced like an engine ({meta['ttft_ms']:g} ms to the first token, "
        f"{meta['tpot_ms']:g} ms per token after it)"
    )


def markdown(rows: list[dict], vllm: dict | None, soak: dict | None, meta: dict) -> str:
    lines = [
        f"Measured {meta['date']} on {meta['machine']}; {meta['tokens']} tokens per completion"
        f"{_pacing(meta)}; "
        f"gateway pinned to core {meta['gateway_core']}, upstream and load generator to core "
        f"{meta['other_core']}; {meta['duration']} s per point after {meta['warmup']} s warm-up; "
        f"ledger drain (Celery) {meta['ledger']} while measuring; tracing "
        f"{meta.get('tracing', 'off')}.",
        "",
        "| mode | C | direct rps | gateway rps | throughput ratio | added p50 ms | added p99 ms "
        "| upstream p50 ms | gateway CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        d, g = row["direct"], row["gateway"]
        lines.append(
            f"| {'stream' if row['stream'] else 'non-stream'} | {row['concurrency']} "
            f"| {d['rps']:.0f} | {g['rps']:.0f} | {g['rps'] / d['rps']:.2f} "
            f"| {g['p50_ms'] - d['p50_ms']:.2f} | {g['p99_ms'] - d['p99_ms']:.2f} "
            f"| {d['p50_ms']:.2f} | {g['cpu_ms_per_request']:.3f} |"
        )
    for name, label in meta["yardsticks"].items():
        lines += ["", *_yardstick_table(rows, name, label, meta)]
    if vllm:
        lines += [
            "",
            f"Real vLLM CPU worker, tiny model, {vllm['tokens']} tokens per streamed completion, "
            f"C={vllm['concurrency']}:",
            "",
            "| path | completions/s | tokens/s | p50 ms | p99 ms |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in ("direct", "gateway"):
            r = vllm[name]
            lines.append(
                f"| {name} | {r['rps']:.1f} | {r['rps'] * vllm['tokens']:.0f} "
                f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
            )
    if soak:
        lines += [
            "",
            f"Soak: {soak['seconds']} s at C={soak['concurrency']} ({soak['requests']} requests); "
            f"gateway RSS {soak['rss_start_mb']:.1f} MB after warm-up, "
            f"{soak['rss_end_mb']:.1f} MB at the end, {soak['rss_max_mb']:.1f} MB at most.",
        ]
    return "\n".join(lines) + "\n"


def _yardstick_table(rows: list[dict], name: str, label: str, meta: dict) -> list[str]:
    """The same points through another gateway: what a share of its cost means on this
    machine. With rounds, medians, and each CPU figure's range over the rounds in brackets."""
    short = label.split()[0]
    rounds = meta["rounds"]
    lines = [
        f"The same points through {label} (one process, the same core, upstream and load"
        + (f"; {rounds} rounds in rotating order, medians [range]" if rounds > 1 else "")
        + "):",
        "",
        f"| mode | C | {short} rps | DMX rps | DMX/{short} rps | {short} added p50 ms "
        f"| DMX added p50 ms | {short} CPU ms/req | DMX CPU ms/req | DMX CPU share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        d, g, other = row["direct"], row["gateway"], row[name]
        failed = sum(count for status, count in other["statuses"].items() if status != 200)
        if failed:
            lines.append(
                f"| {'stream' if row['stream'] else 'non-stream'} | {row['concurrency']} "
                f"| failed: {failed} of {other['requests']} requests not 200 "
                f"({', '.join(map(str, other['statuses']))}) | {g['rps']:.0f} | | | "
                f"{g['p50_ms'] - d['p50_ms']:.2f} | | {_cpu(g)} | |"
            )
            continue
        lines.append(
            f"| {'stream' if row['stream'] else 'non-stream'} | {row['concurrency']} "
            f"| {other['rps']:.0f} | {g['rps']:.0f} | {g['rps'] / other['rps']:.1f} "
            f"| {other['p50_ms'] - d['p50_ms']:.2f} | {g['p50_ms'] - d['p50_ms']:.2f} "
            f"| {_cpu(other)} | {_cpu(g)} "
            f"| {g['cpu_ms_per_request'] / other['cpu_ms_per_request']:.3f} |"
        )
    return lines


def _cpu(result: dict) -> str:
    low_high = result.get("cpu_ms_range")
    figure = f"{result['cpu_ms_per_request']:.3f}"
    return f"{figure} [{low_high[0]:.3f}, {low_high[1]:.3f}]" if low_high else figure


def soak(args, key: str, gateway_pid: int, gateway_url: str) -> dict:
    body = loadgen.request_body(model=MODEL, stream=False, tokens=args.tokens)
    import uvloop

    uvloop.run(
        loadgen.run(
            gateway_url + "/v1/chat/completions", key, body, concurrency=32, warmup=0, duration=10
        )
    )
    samples = [rss_mb(gateway_pid)]
    requests = 0
    for _ in range(max(1, args.soak // 10)):
        result = uvloop.run(
            loadgen.run(
                gateway_url + "/v1/chat/completions",
                key,
                body,
                concurrency=32,
                warmup=0,
                duration=10,
            )
        )
        requests += result["requests"]
        samples.append(rss_mb(gateway_pid))
    return {
        "seconds": args.soak,
        "concurrency": 32,
        "requests": requests,
        "rss_start_mb": samples[0],
        "rss_end_mb": samples[-1],
        "rss_max_mb": max(samples),
        "rss_samples_mb": samples,
    }


def vllm_point(
    args, procs: Processes, env: dict, credentials: dict, gateway_url: str, other_core: str
) -> dict:
    port = free_port()
    procs.start(
        "vllm-worker",
        [
            str(WORKER_PYTHON),
            "-m",
            "inference.worker",
            "--model",
            str(ROOT / ".cache" / "models" / "dmx-tiny"),
            "--name",
            MODEL,
            "--port",
            str(port),
            "--node-name",
            "bench-vllm",
            "--platform-url",
            gateway_url,
            "--run-dir",
            str(RUN_DIR / "vllm"),
            "--",
            *TINY_MODEL_VLLM_ARGS,
        ],
        other_core,
        env=dict(
            env,
            DMX_NODE_TOKEN=credentials["token"],
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",
        ),
    )
    direct_url = f"http://127.0.0.1:{port}"
    _wait(direct_url + "/health", timeout=180)
    common = dict(stream=True, concurrency=8, tokens=64, warmup=3, duration=args.vllm_duration)
    # The fake upstream's node is drained first, so the gateway routes to vLLM only.
    direct = measure(direct_url + "/v1/chat/completions", None, **common)
    via = measure(gateway_url + "/v1/chat/completions", credentials["key"], **common)
    return {"tokens": 64, "concurrency": 8, "direct": direct, "gateway": via}


def start_otlp_sink(procs: Processes, core: str) -> str:
    """Start the OTLP/HTTP sink on the upstream's core; return its URL, once it answers."""
    port = free_port()
    procs.start("otlp-sink", [str(PYTHON), "bench/otlp_sink.py", "--port", str(port)], core)
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/stats")
    return url


def start_litellm(procs: Processes, upstream_url: str, core: str) -> Yardstick:
    """Start LiteLLM's proxy on the gateway's core, in front of the same upstream."""
    port = free_port()
    process = procs.start(
        "litellm",
        litellm_proxy.argv(
            litellm_proxy.config(RUN_DIR, model=MODEL, upstream_url=upstream_url), port
        ),
        core,
        env=litellm_proxy.env(),
    )
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health/liveliness", timeout=120)
    label = f"LiteLLM proxy {litellm_proxy.version()}"
    return Yardstick("litellm", label, url, litellm_proxy.MASTER_KEY, [process.pid])


def start_portkey(procs: Processes, upstream_url: str, core: str) -> Yardstick:
    """Start Portkey's gateway on the gateway's core, in front of the same upstream."""
    port = free_port()
    process = procs.start("portkey", portkey_gateway.argv(port), core, env=portkey_gateway.env())
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/", timeout=60)
    return Yardstick(
        "portkey",
        f"Portkey gateway {portkey_gateway.version()}",
        url,
        "none",  # the upstream's API key, which the fake upstream does not check
        group_members(process.pid),
        portkey_gateway.headers(upstream_url),
    )


def start_granian(procs: Processes, env: dict[str, str], core: str) -> tuple[str, list[int]]:
    """The same gateway served by Granian instead of uvicorn, on the gateway's core, with a
    metrics directory of its own as config.serve gives uvicorn's; returns its URL and the PIDs
    of its processes, once it serves."""
    port = free_port()
    metrics = RUN_DIR / "granian-metrics"
    shutil.rmtree(metrics, ignore_errors=True)
    metrics.mkdir(parents=True)
    argv = [
        str(PYTHON), "-m", "granian", "--interface", "asgi", "--loop", "uvloop",
        "--workers", "1", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning", "config.asgi:application",
    ]  # fmt: skip
    process = procs.start(
        "granian",
        argv,
        core,
        dict(env, PYTHONPATH=str(GRANIAN_LIB), PROMETHEUS_MULTIPROC_DIR=str(metrics)),
    )
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health")
    return url, group_members(process.pid)


def py_spy_record(pid: int, seconds: float, out: Path, *extra: str) -> subprocess.Popen:
    """Start py-spy sampling `pid` for `seconds` at 400 Hz, raw stacks to `out`."""
    return subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--pid", str(pid), *extra,
            "--duration", str(seconds), "--rate", "400", "--format", "raw",
            "--output", str(out), "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def profile(args, key: str, gateway_pid: int, gateway_url: str) -> str:
    """Sample the gateway with py-spy under load; return the top functions by own time."""
    import threading

    sections = []
    for stream in (False, True):
        body = loadgen.request_body(model=MODEL, stream=stream, tokens=args.tokens)
        out = RUN_DIR / f"profile-{'stream' if stream else 'json'}.txt"
        load = threading.Thread(
            target=lambda body=body: asyncio.run(
                loadgen.run(
                    gateway_url + "/v1/chat/completions",
                    key,
                    body,
                    concurrency=args.profile_concurrency,
                    warmup=0,
                    duration=args.profile + 3,
                )
            )
        )
        load.start()
        time.sleep(1)
        py_spy_record(gateway_pid, args.profile, out).wait()
        load.join()
        kind = "streamed" if stream else "non-streamed"
        sections.append(_top_frames(out, title=f"{kind} requests at C={args.profile_concurrency}"))
    return "\n".join(sections)


def _top_frames(path: Path, *, title: str, limit: int = 15) -> str:
    """Own-time and inclusive-time shares of the hottest functions in py-spy's raw output."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        frames = [f.split(" (")[0] + " " + f.split("(")[-1].split(":")[0] for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + samples
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + samples
    rows = [
        f"Top {limit} by own time, {title} ({total} samples):",
        "",
        "| own % | incl. % | function |",
        "|---:|---:|---|",
    ]
    for frame, samples in sorted(own.items(), key=lambda kv: -kv[1])[:limit]:
        rows.append(
            f"| {100 * samples / total:.1f} | {100 * inclusive[frame] / total:.1f} | `{frame}` |"
        )
    return "\n".join(rows) + "\n"


@dataclass
class FakeUpstreamStack:
    gateway: subprocess.Popen
    celery: subprocess.Popen | None
    attached: list[subprocess.Popen]
    upstream_url: str
    gateway_url: str


def start_fake_upstream_stack(
    procs: Processes,
    env: dict[str, str],
    credentials: dict[str, str],
    *,
    tokens: int,
    ttft_ms: float,
    tpot_ms: float,
    with_celery: bool,
    models: dict[str, int] | None = None,
    gateway_tree: Path | None = None,
) -> FakeUpstreamStack:
    """The fake upstream and Celery on the second core, the gateway pinned to the first, and a
    worker attached to the upstream for each of `models` (name: context); returns once the
    gateway serves them. `gateway_tree`: run the gateway from that checkout instead."""
    models = models or {MODEL: 2048}
    gateway_core, other_core = _cores()
    upstream_port, gateway_port = free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    procs.start(
        "upstream",
        [
            str(PYTHON),
            "bench/upstream.py",
            "--port",
            str(upstream_port),
            "--tokens",
            str(tokens),
            "--ttft-ms",
            str(ttft_ms),
            "--tpot-ms",
            str(tpot_ms),
            "--models",
            ",".join(f"{name}:{context}" for name, context in models.items()),
        ],
        other_core,
    )
    # Another checkout's gateway (a before-and-after comparison): its code first on the path.
    gateway = procs.start(
        "gateway",
        [*gateway_argv(gateway_port), "--log-level", "warning"],
        gateway_core,
        dict(env, PYTHONPATH=str(gateway_tree)) if gateway_tree else None,
        cwd=gateway_tree or ROOT,
    )
    celery = (
        procs.start(
            "celery", celery_argv(RUN_DIR / "celerybeat-schedule"), other_core, background=True
        )
        if with_celery
        else None
    )
    _wait(gateway_url + "/health")
    _wait(upstream_url + "/health")
    attached = [
        procs.start(
            f"attached-worker-{model}",
            [
                str(WORKER_PYTHON),
                "-m",
                "inference.worker",
                "--model",
                str(ROOT / ".cache" / "models" / "dmx-tiny"),
                "--name",
                model,
                "--attach",
                upstream_url,
                "--node-name",
                f"bench-upstream-{model}",
                "--platform-url",
                gateway_url,
                # The fake upstream has no batch limit; declare vLLM's default, so the gateway
                # counts requests beyond it (none here) as queued, as it would for an engine.
                "--",
                "--max-num-seqs",
                "256",
            ],
            other_core,
            dict(env, DMX_NODE_TOKEN=credentials["token"]),
            background=True,
        )
        for model in models
    ]
    for model in models:
        _wait(gateway_url + "/v1/models", key=credentials["key"], contains=f'"{model}"')
    return FakeUpstreamStack(gateway, celery, attached, upstream_url, gateway_url)


def _granian_version() -> str:
    found = next(GRANIAN_LIB.glob("granian-*.dist-info"))
    return found.name.removeprefix("granian-").removesuffix(".dist-info")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short points")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--ttft-ms", type=float, default=0, help="the upstream's time to first token (pacing)"
    )
    parser.add_argument("--tpot-ms", type=float, default=0, help="the upstream's time per token")
    parser.add_argument(
        "--results", default="latest", help="name of the bench/results/NAME.md and .json files"
    )
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--duration", type=float, default=15)
    parser.add_argument("--soak", type=int, default=0, help="seconds of memory soak (e.g. 600)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--vllm-duration", type=float, default=20)
    parser.add_argument("--redis-db", type=int, default=12)
    parser.add_argument("--profile", type=int, default=0, help="seconds of py-spy sampling")
    parser.add_argument("--profile-concurrency", type=int, default=8)
    parser.add_argument(
        "--ledger-live",
        action="store_true",
        help="keep the ledger's drain (Celery) running while points are measured",
    )
    parser.add_argument("--no-points", action="store_true", help="skip the latency points")
    parser.add_argument(
        "--billing",
        action="store_true",
        help="budgets and balances on against off: two keys in alternate windows at C=1",
    )
    parser.add_argument(
        "--billing-rounds", type=int, default=12, help="windows of each key with --billing"
    )
    parser.add_argument(
        "--no-leases",
        action="store_true",
        help="no admission leases (DMX_ADMISSION_LEASE_REQUESTS=0): every admission in Redis",
    )
    parser.add_argument(
        "--otlp",
        action="store_true",
        help="trace every request (DMX_OTLP_ENDPOINT) to a collector that keeps nothing",
    )
    parser.add_argument(
        "--portkey",
        action="store_true",
        help="also measure Portkey's gateway at each point (bench/setup_portkey.sh installs it)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the gateway and each yardstick this many times per point, in turn",
    )
    parser.add_argument(
        "--granian",
        action="store_true",
        help="the gateway under uvicorn against under Granian, in alternate windows "
        "(bench/setup_granian.sh installs it)",
    )
    parser.add_argument(
        "--server-rounds", type=int, default=4, help="windows of each server with --granian"
    )
    parser.add_argument(
        "--litellm",
        action="store_true",
        help="also measure LiteLLM's proxy at each point (bench/setup_litellm.sh installs it)",
    )
    args = parser.parse_args()
    if args.litellm and not litellm_proxy.available():
        parser.error("--litellm needs bench/setup_litellm.sh to have been run")
    if args.portkey and not portkey_gateway.available():
        parser.error("--portkey needs bench/setup_portkey.sh to have been run")
    if args.granian and not (GRANIAN_LIB / "granian").is_dir():
        parser.error("--granian needs bench/setup_granian.sh to have been run")
    if args.quick:
        args.warmup, args.duration, args.vllm_duration = 0.5, 1.5, 3

    gateway_core, other_core = _cores()
    env = _env(args.redis_db)
    if args.no_leases:
        env["DMX_ADMISSION_LEASE_REQUESTS"] = "0"
    credentials = setup(env)
    procs = Processes(env)
    try:
        if args.otlp:
            env["DMX_OTLP_ENDPOINT"] = start_otlp_sink(procs, other_core)
        stack = start_fake_upstream_stack(
            procs,
            env,
            credentials,
            tokens=args.tokens,
            ttft_ms=args.ttft_ms,
            tpot_ms=args.tpot_ms,
            with_celery=True,
        )
        gateway, attached = stack.gateway, stack.attached[0]
        upstream_url, gateway_url = stack.upstream_url, stack.gateway_url
        ledger = LedgerPause(None if args.ledger_live else stack.celery, args.redis_db)
        yardsticks = [
            *([start_litellm(procs, upstream_url, gateway_core)] if args.litellm else []),
            *([start_portkey(procs, upstream_url, gateway_core)] if args.portkey else []),
        ]
        rows = (
            []
            if args.no_points
            else fake_upstream_points(
                args,
                env,
                credentials["key"],
                gateway.pid,
                upstream_url,
                gateway_url,
                ledger,
                yardsticks,
            )
        )
        billing = (
            billing_points(
                args,
                {"A": credentials["key"], "B": credentials["billing_key"]},
                gateway.pid,
                upstream_url,
                gateway_url,
                ledger,
            )
            if args.billing
            else None
        )
        servers = (
            server_points(
                args,
                credentials["key"],
                {
                    "A": (gateway_url, [gateway.pid]),
                    "B": start_granian(procs, env, gateway_core),
                },
                upstream_url,
                ledger,
            )
            if args.granian
            else None
        )
        profiled = (
            profile(args, credentials["key"], gateway.pid, gateway_url) if args.profile else ""
        )
        soak_result = (
            soak(args, credentials["key"], gateway.pid, gateway_url) if args.soak else None
        )
        vllm = None
        if not args.no_vllm:
            os.killpg(attached.pid, signal.SIGTERM)  # drains: traffic moves to the real engine
            attached.wait(timeout=30)
            vllm = vllm_point(args, procs, env, credentials, gateway_url, other_core)
    finally:
        procs.stop()
    meta = {
        "date": datetime.now(tz=UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "tokens": args.tokens,
        "ttft_ms": args.ttft_ms,
        "tpot_ms": args.tpot_ms,
        "gateway_core": gateway_core,
        "other_core": other_core,
        "warmup": args.warmup,
        "duration": args.duration,
        "ledger": "live" if args.ledger_live else "paused",
        "yardsticks": {yardstick.name: yardstick.label for yardstick in yardsticks},
        "rounds": args.rounds,
        "tracing": "on, every request" if args.otlp else "off",
        "billing_rounds": args.billing_rounds if args.billing else 0,
        "server_rounds": args.server_rounds if args.granian else 0,
        "granian": _granian_version() if args.granian else None,
        "leases": env.get("DMX_ADMISSION_LEASE_REQUESTS", "") != "0",
    }
    table = (
        markdown(rows, vllm, soak_result, meta)
        + ("\n" + billing_markdown(billing, meta) if billing else "")
        + ("\n" + server_markdown(servers, meta) if servers else "")
        + ("\n" + profiled if profiled else "")
    )
    print(table)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.results}.md").write_text(table)
        (RESULTS / f"{args.results}.json").write_text(
            json.dumps(
                {
                    "meta": meta,
                    "points": rows,
                    "vllm": vllm,
                    "soak": soak_result,
                    "billing": billing,
                    "servers": servers,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
