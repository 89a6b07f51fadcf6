"""Capacity on paper, from measured figures: gateway CPU, Redis work and ledger rows per request.

    .venv/bin/python bench/capacity.py     # about 7 minutes; writes bench/results/capacity.md
    .venv/bin/python bench/capacity.py --repeats 2 --duration 4 --events 10000   # shorter

Everything runs against instances of its own: a redis-server on a free loopback port (append-only,
as production runs it) and a scratch PostgreSQL database (`dmx_capacity_<pid>`, created with
createdb on the server in DMX_CAPACITY_PG, dropped at the end). It measures, with CPU time
rather than wall time (the machine is shared):

1. the gateway's CPU per request (bench/run.py's stack: the fake upstream, an attached worker,
   one gateway process on its own core), unstreamed and streamed at concurrency 1 and 64, with
   admission leases on (the default) and off;
2. Redis's work per request: its own CPU (/proc of the redis-server), INFO commandstats, and
   a MONITOR window that tells the client's commands from the ones Lua scripts run, with the
   process's background (state refresh, heartbeats) measured idle and taken off; and the
   admit and settle scripts replayed by redis-benchmark for one Redis core's ceiling;
3. the ledger: usage events built from the ones the gateway appended, drained into PostgreSQL
   by apps.billing.services.usage_flush (Celery's task body) in this process, rows per second of
   wall time and of CPU (this process and the PostgreSQL backend, from /proc).
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import uvloop  # noqa: E402

from bench import loadgen  # noqa: E402
from bench.run import (  # noqa: E402
    MODEL,
    Processes,
    _cores,
    _env,
    cpu_seconds,
    setup,
    start_fake_upstream_stack,
)
from tests.stack import free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PREFIX = "dmxcap"
LUA = ROOT / "apps" / "keys" / "lua"
SCRIPTS = {
    hashlib.sha1((LUA / f"{name}.lua").read_bytes()).hexdigest(): name
    for name in ("admit", "settle")
}
# Figures the plan assumes.
TARGET_UTILISATION = 0.6
RATES = (1_000, 10_000, 100_000)
SCRIPTED = ("eval", "evalsha", "fcall")
MONITOR_LINE = re.compile(r'^[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"(?: "([^"]*)")?')
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


# --- private instances ---------------------------------------------------------------------


class PrivateRedis:
    """A redis-server of our own on a free loopback port, append-only like production's."""

    def __init__(self, core: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dmx-capacity-redis-"))
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                *("taskset", "-c", core, "redis-server", "--port", str(self.port)),
                *("--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"),
                *("--appendfsync", "everysec", "--dir", str(self.dir)),
            ],
            stdout=(self.dir / "log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # taskset execs redis-server: the PID is the server's own.
        self.pid = self.process.pid

    def cpu(self) -> float:
        return cpu_seconds([self.pid])

    def calls(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}
        # Time inside the scripts (their commands included), as Redis measures it.
        calls["script_usec"] = sum(stats.get(f"cmdstat_{n}", {}).get("usec", 0) for n in SCRIPTED)
        return calls

    def stop(self) -> None:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class ScratchDatabase:
    def __init__(self, server: str) -> None:
        self.server = server  # postgres://user@host:port
        self.name = f"dmx_capacity_{os.getpid()}"
        self.url = f"{server}/{self.name}"
        subprocess.run(["createdb", *self._conn(), self.name], check=True)

    def _conn(self) -> list[str]:
        rest = self.server.removeprefix("postgres://")
        user, _, hostport = rest.rpartition("@")
        host, _, port = hostport.partition(":")
        return ["-h", host, "-p", port or "5432", "-U", user or "postgres"]

    def drop(self) -> None:
        subprocess.run(["dropdb", "--force", *self._conn(), self.name], check=False)


# --- gateway points ------------------------------------------------------------------------


class Monitor:
    """Counts Redis commands by client (a connection or a Lua script) while it runs."""

    def __init__(self, port: int, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            ["redis-cli", "-p", str(port), "monitor"], stdout=out.open("wb")
        )
        time.sleep(0.3)

    def stop(self) -> dict[str, int]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)
        counts: dict[str, int] = {}
        for line in self.out.read_text(errors="replace").splitlines():
            match = MONITOR_LINE.match(line)
            if not match:
                continue
            client, command, first = match.groups()
            command = command.lower()
            if command in ("evalsha", "eval"):
                command += ":" + SCRIPTS.get(first or "", "other")
            where = "lua" if client == "lua" else "client"
            counts[f"{where} {command}"] = counts.get(f"{where} {command}", 0) + 1
        return counts


def capture_script_calls(out: Path) -> dict[str, list[bytes]]:
    """One full EVALSHA line per script from a MONITOR log: the arguments to replay."""
    found: dict[str, list[bytes]] = {}
    for line in out.read_text(errors="replace").splitlines():
        match = MONITOR_LINE.match(line)
        if not match or match.group(2).lower() != "evalsha" or match.group(1) == "lua":
            continue
        name = SCRIPTS.get(match.group(3) or "")
        if name and name not in found:
            found[name] = [codecs.escape_decode(a.encode())[0] for a in ARG.findall(line)]
    return found


def delete_streams(client: redis.Redis) -> list[bytes]:
    """Empty the streams the gateway appended to (no Celery drains them here); return a few of
    the usage events first, as the ledger's templates."""
    usage = client.xrange(f"{PREFIX}:{{s0}}:usage:stream", count=4)  # one shard, the default
    for key in client.scan_iter(f"{PREFIX}:*", _type="stream"):
        client.delete(key)
    return [fields[b"e"] for _, fields in usage]


def load(url: str, key: str, *, stream: bool, concurrency: int, seconds: float) -> dict:
    body = loadgen.request_body(model=MODEL, stream=stream, tokens=16)
    return uvloop.run(
        loadgen.run(url, key, body, concurrency=concurrency, warmup=0, duration=seconds)
    )


def idle_background(rds: PrivateRedis, gateway_pid: int, worker_pid: int, seconds: float) -> dict:
    """Redis commands per second of a gateway with no traffic: with its worker's heartbeats,
    and with the worker stopped (the state refresh and lease sweep alone)."""
    out = {}
    for name, stop_worker in (("with heartbeats", False), ("refresh only", True)):
        if stop_worker:
            os.killpg(worker_pid, signal.SIGSTOP)
        try:
            cpu0, rcpu0 = cpu_seconds([gateway_pid]), rds.cpu()
            monitor = Monitor(rds.port, Path(rds.dir) / f"idle-{stop_worker}.log")
            time.sleep(seconds)
            counts = monitor.stop()
            out[name] = {
                "per_second": {k: v / seconds for k, v in sorted(counts.items())},
                "gateway_cpu_ms_per_s": (cpu_seconds([gateway_pid]) - cpu0) * 1000 / seconds,
                "redis_cpu_ms_per_s": (rds.cpu() - rcpu0) * 1000 / seconds,
            }
        finally:
            if stop_worker:
                os.killpg(worker_pid, signal.SIGCONT)
    time.sleep(1.5)  # the worker's next heartbeat
    return out


def gateway_points(args, rds: PrivateRedis, env: dict, credentials: dict, leases: bool) -> dict:
    env = dict(env, DMX_ADMISSION_LEASE_REQUESTS="16" if leases else "0")
    procs = Processes(env)
    templates: list[bytes] = []
    try:
        stack = start_fake_upstream_stack(
            procs, env, credentials, tokens=16, ttft_ms=0, tpot_ms=0, with_celery=False
        )
        url = stack.gateway_url + "/v1/chat/completions"
        gateway, worker = stack.gateway.pid, stack.attached[0].pid
        time.sleep(2)
        idle = idle_background(rds, gateway, worker, args.idle)
        background = idle["with heartbeats"]
        points = []
        for stream in (False, True):
            for concurrency in (1, 64):
                common = dict(stream=stream, concurrency=concurrency)
                load(url, credentials["key"], seconds=args.warmup, **common)
                reps = []
                for _ in range(args.repeats):
                    rds.client.config_resetstat()
                    g0, r0 = cpu_seconds([gateway]), rds.cpu()
                    result = load(url, credentials["key"], seconds=args.duration, **common)
                    g1, r1 = cpu_seconds([gateway]), rds.cpu()
                    calls = rds.calls()
                    calls.pop("config|resetstat", None)
                    calls.pop("info", None)
                    n = max(result["requests"], 1)
                    bg_redis_ms = background["redis_cpu_ms_per_s"] * args.duration
                    reps.append(
                        {
                            "requests": result["requests"],
                            "rps": result["rps"],
                            "statuses": result["statuses"],
                            "gateway_cpu_ms": (g1 - g0) * 1000 / n,
                            "redis_cpu_us": (r1 - r0) * 1e6 / n,
                            "redis_cpu_us_net": max(0.0, (r1 - r0) * 1e6 - bg_redis_ms * 1e3) / n,
                            "script_us": calls.pop("script_usec") / n,
                            "commandstats_per_request": {
                                k: round(v / n, 3) for k, v in sorted(calls.items())
                            },
                        }
                    )
                    templates[:] = delete_streams(rds.client) or templates
                # The command mix: a short window under MONITOR (which slows Redis: its CPU
                # figures come from the windows above), the idle background taken off.
                log = Path(rds.dir) / f"monitor-{leases}-{stream}-{concurrency}.log"
                monitor = Monitor(rds.port, log)
                result = load(url, credentials["key"], seconds=args.monitor, **common)
                counts = monitor.stop()
                if not leases and not stream and concurrency == 1:
                    args.script_calls = capture_script_calls(log)
                delete_streams(rds.client)
                n = max(result["requests"], 1)
                mix = {
                    k: round((v - background["per_second"].get(k, 0) * args.monitor) / n, 3)
                    for k, v in sorted(counts.items())
                }
                mix = {k: v for k, v in mix.items() if abs(v) >= 0.02}
                points.append(
                    {"stream": stream, "concurrency": concurrency, "reps": reps, "mix": mix}
                )
                print(_point_text(leases, points[-1]), flush=True)
        return {"idle": idle, "points": points, "templates": templates}
    finally:
        procs.stop()


def _spread(values: list[float], digits: int = 3) -> str:
    lo, hi = min(values), max(values)
    med = statistics.median(values)
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _point_text(leases: bool, point: dict) -> str:
    reps = point["reps"]
    return (
        f"leases {'on ' if leases else 'off'} {'stream' if point['stream'] else 'json  '} "
        f"C={point['concurrency']:<3} rps {_spread([r['rps'] for r in reps], 0)} "
        f"gateway CPU ms/req {_spread([r['gateway_cpu_ms'] for r in reps])} "
        f"redis CPU µs/req {_spread([r['redis_cpu_us'] for r in reps], 1)} mix {point['mix']}"
    )


# --- Redis's ceiling on the same scripts -------------------------------------------------


def script_ceiling(rds: PrivateRedis, script_calls: dict, requests: int) -> dict:
    """redis-benchmark replays the admit and settle calls a gateway made (unleased); Redis CPU
    per call from /proc, with 32 clients, unpipelined and 16 deep."""
    out = {}
    if not shutil.which("redis-benchmark"):
        return out
    for name, argv in sorted(script_calls.items()):
        for pipeline in (1, 16):
            before = rds.cpu()
            subprocess.run(
                [
                    *("redis-benchmark", "-p", str(rds.port), "-c", "32", "-n", str(requests)),
                    *("-P", str(pipeline), "-q", *[a.decode("latin-1") for a in argv]),
                ],
                check=True,
                capture_output=True,
            )
            used = rds.cpu() - before
            out[f"{name} P={pipeline}"] = {
                "redis_cpu_us_per_call": used * 1e6 / requests,
                "calls_per_redis_cpu_second": requests / used if used else 0,
            }
        delete_streams(rds.client)
    before = rds.cpu()
    subprocess.run(
        [
            *("redis-benchmark", "-p", str(rds.port), "-c", "32"),
            *("-n", str(requests * 4), "-q", "-t", "get"),
        ],
        check=True,
        capture_output=True,
    )
    out["GET P=1"] = {
        "redis_cpu_us_per_call": (rds.cpu() - before) * 1e6 / (requests * 4),
        "calls_per_redis_cpu_second": requests * 4 / max(rds.cpu() - before, 1e-9),
    }
    return out


# --- the ledger ----------------------------------------------------------------------------


def ledger_drain(args, rds: PrivateRedis, templates: list[bytes]) -> list[dict]:
    import django

    django.setup()
    from django.db import connection

    from apps.billing.ledger import USAGE_STREAM, UsageEvent
    from apps.billing.models import UsageRecord
    from apps.billing.services import usage_flush
    from dmxplatform.streams import FIELD

    events = [UsageEvent.decode(t) for t in templates]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        walwriter = [row[0] for row in cursor.fetchall()]

    def pg_cpu(pids: list[int]) -> float | None:
        try:
            return cpu_seconds(pids)
        except OSError:
            return None

    runs = []
    for rep in range(args.repeats):
        pipe = rds.client.pipeline(transaction=False)
        for i in range(args.events):
            event = dataclasses.replace(
                events[i % len(events)],
                request_id=f"req_{rep:02d}{i:08d}{os.urandom(8).hex()}",
                created_at=time.time(),
            )
            pipe.xadd(USAGE_STREAM.of_tenant(event.tenant_id).key(), {FIELD: event.encode()})
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        stored_before = UsageRecord.objects.count()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        b0, w0, r0 = pg_cpu([backend]), pg_cpu(walwriter), rds.cpu()
        calls = 0
        while usage_flush():
            calls += 1
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        b1, w1, r1 = pg_cpu([backend]), pg_cpu(walwriter), rds.cpu()
        stored = UsageRecord.objects.count() - stored_before
        runs.append(
            {
                "events": args.events,
                "stored": stored,
                "flush_calls": calls,
                "wall_s": wall,
                "rows_per_wall_s": stored / wall,
                "worker_cpu_s": cpu,
                "rows_per_worker_cpu_s": stored / cpu,
                "pg_backend_cpu_s": None if b0 is None or b1 is None else b1 - b0,
                "pg_walwriter_cpu_s": None if w0 is None or w1 is None else w1 - w0,
                "rows_per_cpu_s": None if b0 is None or b1 is None else stored / (cpu + b1 - b0),
                "redis_cpu_s": r1 - r0,
                "event_bytes": len(events[0].encode()),
            }
        )
        print(f"ledger: {json.dumps(runs[-1])}", flush=True)
    return runs


# --- the plan ------------------------------------------------------------------------------


def plan(results: dict) -> dict:
    """Per-request figures for the table: the worst of the measured points where it matters."""
    on = results["gateway"]["on"]["points"]
    off = results["gateway"]["off"]["points"]

    def med(points, key, **match):
        return max(
            statistics.median(r[key] for r in p["reps"])
            for p in points
            if all(p[k] == v for k, v in match.items())
        )

    gateway_ms = med(on, "gateway_cpu_ms", concurrency=64)  # loaded: the larger of the modes
    redis_on = med(on, "redis_cpu_us_net", concurrency=64)
    redis_off = med(off, "redis_cpu_us_net", concurrency=64)
    redis_us = max(redis_on, redis_off)
    ledger = results["ledger"]
    rows_wall = statistics.median(r["rows_per_wall_s"] for r in ledger)
    # On a shared machine the drain waits for cores; a drain is serial (the worker, then its
    # PostgreSQL backend, in turn), so on cores of its own it moves rows / (both CPU times).
    rows_cpu = statistics.median(r["rows_per_cpu_s"] or r["rows_per_wall_s"] for r in ledger)
    # One drain per stream runs at a time (an advisory lock); a drain that moved a whole task's
    # worth goes again at once (streams.drain_task), so the beat's cadence caps nothing.
    drain = rows_cpu
    rows = []
    for rate in RATES:
        rows.append(
            {
                "rate": rate,
                "gateway_cores": rate * gateway_ms / 1000,
                "gateway_pods": math.ceil(rate * gateway_ms / 1000 / TARGET_UTILISATION),
                "redis_cores": rate * redis_us / 1e6,
                "redis_shards": math.ceil(rate * redis_us / 1e6 / TARGET_UTILISATION),
                "ledger_streams": math.ceil(rate / drain / TARGET_UTILISATION),
            }
        )
    return {
        "gateway_ms": gateway_ms,
        "redis_us_leases": redis_on,
        "redis_us_unleased": redis_off,
        "redis_us": redis_us,
        "drain": drain,
        "rows_per_wall_s": rows_wall,
        "rows_per_cpu_s": rows_cpu,
        "rows": rows,
    }


def markdown(results: dict) -> str:
    meta, p = results["meta"], results["plan"]
    lines = [
        f"Measured {meta['date']} on {meta['machine']}, shared; bench/capacity.py with "
        f"{meta['repeats']} repeats of {meta['duration']} s per point (median, min-max). CPU "
        "time from /proc, not wall time. Gateway: one process pinned to a core, the fake "
        "upstream (16 tokens), a private append-only redis-server, no Celery during points.",
        "",
        "## Gateway CPU and Redis work per request",
        "",
        "| leases | mode | C | rps | gateway CPU ms/req | Redis CPU µs/req | Redis CPU µs/req "
        "less idle | in scripts µs/req | client commands/req | Lua calls/req "
        "| in-script commands/req |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("on", "off"):
        for point in results["gateway"][name]["points"]:
            reps, mix = point["reps"], point["mix"]
            client = sum(v for k, v in mix.items() if k.startswith("client "))
            lua = sum(v for k, v in mix.items() if k.startswith("client eval"))
            inner = sum(v for k, v in mix.items() if k.startswith("lua "))
            lines.append(
                f"| {name} | {'stream' if point['stream'] else 'non-stream'} "
                f"| {point['concurrency']} | {_spread([r['rps'] for r in reps], 0)} "
                f"| {_spread([r['gateway_cpu_ms'] for r in reps])} "
                f"| {_spread([r['redis_cpu_us'] for r in reps], 1)} "
                f"| {_spread([r['redis_cpu_us_net'] for r in reps], 1)} "
                f"| {_spread([r['script_us'] for r in reps], 1)} "
                f"| {client:.2f} | {lua:.2f} | {inner:.2f} |"
            )
    lines += ["", "Command mix per request (MONITOR window, idle background taken off):", ""]
    for name in ("on", "off"):
        for point in results["gateway"][name]["points"]:
            mix = ", ".join(f"{k} {v:g}" for k, v in point["mix"].items())
            lines.append(
                f"- leases {name}, {'stream' if point['stream'] else 'non-stream'} "
                f"C={point['concurrency']}: {mix}"
            )
    lines += ["", "Idle gateway (one process, no requests), per second:", ""]
    for name, idle in results["gateway"]["on"]["idle"].items():
        mix = ", ".join(f"{k} {v:.1f}" for k, v in idle["per_second"].items())
        lines.append(
            f"- {name}: {sum(idle['per_second'].values()):.1f} commands/s ({mix}); gateway CPU "
            f"{idle['gateway_cpu_ms_per_s']:.1f} ms/s, Redis CPU {idle['redis_cpu_ms_per_s']:.2f}"
            " ms/s"
        )
    if results["ceiling"]:
        lines += [
            "",
            "## Redis's ceiling on the same scripts (redis-benchmark, 32 clients)",
            "",
            "| call | Redis CPU µs/call | calls per Redis CPU-second |",
            "|---|---:|---:|",
        ]
        for name, c in results["ceiling"].items():
            lines.append(
                f"| {name} | {c['redis_cpu_us_per_call']:.1f} "
                f"| {c['calls_per_redis_cpu_second']:,.0f} |"
            )
    lines += [
        "",
        "## Ledger drain (usage_flush in-process, scratch PostgreSQL)",
        "",
        "| events | stored | wall s | rows/s wall | worker CPU s | rows per worker CPU-s "
        "| PG backend CPU s | PG walwriter CPU s | rows per (worker + backend) CPU-s "
        "| Redis CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["ledger"]:
        pg = "n/a" if r["pg_backend_cpu_s"] is None else f"{r['pg_backend_cpu_s']:.2f}"
        wal = "n/a" if r["pg_walwriter_cpu_s"] is None else f"{r['pg_walwriter_cpu_s']:.2f}"
        lines.append(
            f"| {r['events']} | {r['stored']} | {r['wall_s']:.2f} | {r['rows_per_wall_s']:,.0f} "
            f"| {r['worker_cpu_s']:.2f} | {r['rows_per_worker_cpu_s']:,.0f} | {pg} | {wal} "
            f"| {r['rows_per_cpu_s'] or 0:,.0f} | {r['redis_cpu_s']:.2f} |"
        )
    lines += [
        "",
        f"Usage event size: {results['ledger'][0]['event_bytes']} bytes.",
        "",
        "## Plan",
        "",
        f"Gateway {p['gateway_ms']:.3f} ms CPU/request (the larger C=64 median); Redis "
        f"{p['redis_us_leases']:.1f} µs CPU/request with leases, {p['redis_us_unleased']:.1f} "
        f"without (C=64 medians, idle taken off; the plan takes {p['redis_us']:.1f}); ledger "
        f"{p['rows_per_cpu_s']:,.0f} rows/s per drain on cores of its own (wall here: "
        f"{p['rows_per_wall_s']:,.0f}, the cores shared), one drain per stream at a time, "
        f"going again at once while its stream is busy: {p['drain']:,.0f} rows/s per stream "
        f"and Celery worker; "
        f"{TARGET_UTILISATION:.0%} target utilisation.",
        "",
        "| requests/s | gateway CPU cores | gateway pods (1 CPU) | Redis cores "
        "| Redis shards | usage streams = Celery workers |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in p["rows"]:
        lines.append(
            f"| {r['rate']:,} | {r['gateway_cores']:.1f} | {r['gateway_pods']} "
            f"| {r['redis_cores']:.2f} | {r['redis_shards']} | {r['ledger_streams']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--duration", type=float, default=6)
    parser.add_argument("--monitor", type=float, default=2, help="seconds under MONITOR")
    parser.add_argument("--idle", type=float, default=4, help="seconds of idle background")
    parser.add_argument("--events", type=int, default=20_000, help="usage events per drain")
    parser.add_argument("--benchmark-requests", type=int, default=50_000)
    parser.add_argument(
        "--pg",
        default=os.environ.get("DMX_CAPACITY_PG", "postgres://postgres@127.0.0.1:5432"),
        help="the PostgreSQL server for the scratch database",
    )
    parser.add_argument("--results", default="capacity")
    args = parser.parse_args()
    args.script_calls = {}

    other_core = _cores()[1]
    rds = PrivateRedis(other_core)
    database = ScratchDatabase(args.pg)
    try:
        env = _env(0)
        env.update(
            REDIS_URL=f"redis://127.0.0.1:{rds.port}/0",
            DATABASE_URL=database.url,
            DMX_REDIS_PREFIX=PREFIX,
        )
        os.environ.update(
            {k: env[k] for k in ("REDIS_URL", "DATABASE_URL", "DMX_REDIS_PREFIX")},
            DJANGO_SETTINGS_MODULE=env["DJANGO_SETTINGS_MODULE"],
            DMX_DEBUG="1",
            DJANGO_SECRET_KEY=env["DJANGO_SECRET_KEY"],
            DMX_KEY_PEPPER=env["DMX_KEY_PEPPER"],
            DMX_LOG_LEVEL="WARNING",
        )
        credentials = setup(env)
        gateway = {
            "on": gateway_points(args, rds, env, credentials, leases=True),
            "off": gateway_points(args, rds, env, credentials, leases=False),
        }
        templates = gateway["on"].pop("templates") or gateway["off"]["templates"]
        gateway["off"].pop("templates")
        ceiling = script_ceiling(rds, args.script_calls, args.benchmark_requests)
        print(f"ceiling: {json.dumps(ceiling)}", flush=True)
        ledger = ledger_drain(args, rds, templates)
        from django.db import connections

        connections.close_all()
    finally:
        rds.stop()
        database.drop()
    results = {
        "meta": {
            "date": datetime.now(tz=UTC).strftime("%Y-%m-%d"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "repeats": args.repeats,
            "duration": args.duration,
        },
        "gateway": gateway,
        "ceiling": ceiling,
        "ledger": ledger,
    }
    results["plan"] = plan(results)
    text = markdown(results)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.results}.md").write_text(text)


if __name__ == "__main__":
    main()
