"""The whole platform's CPU per request on a realistic workload, against LiteLLM and Portkey.

    .venv/bin/python bench/realistic.py                       # about 8 minutes; bench/results/
    .venv/bin/python bench/realistic.py --litellm --portkey   # with the yardsticks (their
                                                              # bench/setup_*.sh first; 15 min)
    .venv/bin/python bench/realistic.py --quick               # a smoke run, seconds a window
    .venv/bin/python bench/realistic.py --litellm --portkey --short-prompts
                                        # then bench/run.py's short-prompt points with the same
                                        # yardsticks and rounds (bench/results/yardsticks.md):
                                        # every table of the README's, about 27 minutes

The workload is bench/workload.py's: a thousand keys drawn Zipf-distributed (some near their
limits, some signing, a third of the tenants prepaid with budgets), prompt and completion
lengths from Azure's published conversation trace, conversations of human-written prompts up to
8 KB, chat completions, Responses, Messages and embeddings, a share streamed.

Everything of the platform runs, as in production but on two cores: the gateway (config.serve),
a redis-server of this run's own (append-only), Celery with its beat draining the usage, stored
responses and routing decision streams into a scratch PostgreSQL database (the drain runs while
windows are measured; after each window the run waits for the streams to be drained and counts
the drain's CPU up to then). The platform's CPU per request is the gateway's processes, Redis
and Celery, each from /proc; PostgreSQL's (every process of the server, ended backends
included) is reported beside it. The fake upstream (bench/upstream.py) and the load generator
(bench/loadgen.py) are not counted.

Three parts:

1. **Yardsticks.** The workload's non-streamed requests, then its streamed ones, at C = 1, 8,
   64: the upstream alone once, then the platform and each yardstick in rotating rounds. The
   yardsticks have no keys, budgets or dialects: they get each request as a chat completion
   (embeddings as embeddings), the same sizes, through one key.
2. **Processes.** The whole workload at C = 64 through one gateway process on one core and
   through two (DMX_GATEWAY_WORKERS=2) on both cores, in alternate windows: requests per second
   and the platform's CPU per request with each.
3. **Profile.** py-spy samples the gateway and Celery under the whole workload at C=8
   (--profile seconds), at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import uvloop  # noqa: E402

from bench import loadgen, workload  # noqa: E402
from bench.capacity import PrivateRedis, ScratchDatabase  # noqa: E402
from bench.run import (  # noqa: E402
    MODEL,
    RESULTS,
    RUN_DIR,
    Processes,
    Yardstick,
    _cores,
    _env,
    _median,
    _top_frames,
    _turns,
    _wait,
    cpu_seconds,
    py_spy_record,
    setup,
    start_fake_upstream_stack,
    start_litellm,
    start_portkey,
)
from bench.setup_platform import EMBED_CONTEXT, EMBED_MODEL, LONG_CONTEXT, LONG_MODEL  # noqa: E402
from inference.proctree import group_members  # noqa: E402
from tests.stack import free_port, gateway_argv  # noqa: E402

PREFIX = "dmxreal"
# The streams Celery drains (apps.billing.ledger, apps.gateway.response_records,
# apps.routing.decisions), in the one shard of the default.
DRAINED_STREAMS = tuple(
    f"{PREFIX}:{{s0}}:{name}" for name in ("usage:stream", "responses:stream", "routing:decisions")
)
DRAIN_TIMEOUT = 300
REQUESTS = 4_096  # distinct requests drawn; the load cycles through them
COMPLETION_CAP = workload.MAX_COMPLETION_TOKENS


class Platform:
    """The platform's processes and how much CPU they used: the gateway's (one process group
    per gateway), Redis's, Celery's; PostgreSQL's beside."""

    def __init__(self, rds: PrivateRedis, celery_pid: int, database_url: str) -> None:
        self.rds = rds
        self.celery_pid = celery_pid
        with psycopg.connect(database_url, autocommit=True) as connection:
            directory = connection.execute("SHOW data_directory").fetchone()[0]
        # The postmaster's own CPU counts the backends it has reaped (cutime), so the server's
        # figure includes connections that came and went within a window.
        self.postmaster = int(Path(directory, "postmaster.pid").read_text().split()[0])

    def _postgres(self) -> list[int]:
        children = Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children")
        return [self.postmaster, *map(int, children.read_text().split())]

    def cpu(self, gateway_pgid: int) -> dict[str, float]:
        return {
            "gateway": cpu_seconds(group_members(gateway_pgid)),
            "redis": self.rds.cpu(),
            "celery": cpu_seconds(group_members(self.celery_pid)),
            "postgres": cpu_seconds(self._postgres()),
        }

    def drained(self) -> None:
        """Wait until Celery has stored what the gateway appended to the streams."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while sum(self.rds.client.xlen(key) for key in DRAINED_STREAMS):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the streams were not drained in {DRAIN_TIMEOUT} s")
            time.sleep(0.2)


def _window(url: str, payloads: list, *, concurrency: int, seconds: float) -> dict:
    parts = urllib.parse.urlsplit(url)
    return uvloop.run(
        loadgen.drive(
            parts.hostname, parts.port, payloads, concurrency=concurrency, warmup=0,
            duration=seconds,
        )
    )  # fmt: skip


def measure_platform(
    args, plat: Platform, gateway: tuple[str, int], payloads: list, concurrency: int
) -> dict:
    """One window through the platform: warm-up, the streams drained, the window, the streams
    drained again; CPU per request of each part."""
    url, pgid = gateway
    _window(url, payloads, concurrency=concurrency, seconds=args.warmup)
    plat.drained()
    before = plat.cpu(pgid)
    result = _window(url, payloads, concurrency=concurrency, seconds=args.duration)
    after_window = plat.cpu(pgid)
    plat.drained()
    after = plat.cpu(pgid)
    n = max(result["requests"], 1)
    used = {
        # The gateway's and Redis's work is done when the window ends; Celery's and
        # PostgreSQL's when the streams are drained.
        "gateway": after_window["gateway"] - before["gateway"],
        "redis": after_window["redis"] - before["redis"],
        "celery": after["celery"] - before["celery"],
        "postgres": after["postgres"] - before["postgres"],
    }
    result["cpu_ms"] = {part: seconds * 1000 / n for part, seconds in used.items()}
    result["cpu_ms"]["platform"] = sum(result["cpu_ms"][p] for p in ("gateway", "redis", "celery"))
    result["cpu_ms_per_request"] = result["cpu_ms"]["platform"]
    return result


def measure_yardstick(args, target: Yardstick, payloads: list, concurrency: int) -> dict:
    _window(target.url, payloads, concurrency=concurrency, seconds=args.warmup)
    before = cpu_seconds(target.pids)
    result = _window(target.url, payloads, concurrency=concurrency, seconds=args.duration)
    used = cpu_seconds(target.pids) - before
    result["cpu_ms_per_request"] = used * 1000 / max(result["requests"], 1)
    return result


def _plain(requests: list[workload.Request], url: str, key: str | None, headers: dict) -> list:
    """Chat-completion forms of the requests for a gateway with one key (a yardstick) or none
    (the upstream), to the bench model."""
    parts = urllib.parse.urlsplit(url)
    auth = [f"Authorization: Bearer {key}"] if key else []
    extra = [f"{name}: {value}" for name, value in headers.items()]
    out = []
    for request in map(workload.as_chat, requests):
        raw = workload.encode(dict(request.body, model=MODEL))
        head = [
            f"POST {request.path} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(raw)}",
            *auth,
            *extra,
        ]
        out.append(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
    return out


def yardstick_points(args, plat, gateway, requests, keys, yardsticks, upstream_url) -> list[dict]:
    rows = []
    host, port = urllib.parse.urlsplit(gateway[0])[1].split(":")
    for stream in (False, True):
        subset = [r for r in requests if r.stream == stream]
        ours = workload.wire(subset, host, int(port), keys["keys"], keys["signing"])
        theirs = {y.name: _plain(subset, y.url, y.key, y.headers) for y in yardsticks}
        direct_payloads = _plain(subset, upstream_url, None, {})
        for concurrency in args.concurrency:
            direct = measure_yardstick(
                args, Yardstick("direct", "upstream", upstream_url, None, []), direct_payloads,
                concurrency,
            )  # fmt: skip
            rounds: dict[str, list[dict]] = {"dmx": [], **{y.name: [] for y in yardsticks}}
            for _, side in _turns(list(rounds), args.rounds):
                if side == "dmx":
                    result = measure_platform(args, plat, gateway, ours, concurrency)
                else:
                    target = next(y for y in yardsticks if y.name == side)
                    result = measure_yardstick(args, target, theirs[side], concurrency)
                rounds[side].append(result)
                print(_line(stream, concurrency, side, result), flush=True)
            rows.append(
                {"stream": stream, "concurrency": concurrency, "direct": direct, "rounds": rounds}
            )
    return rows


def process_points(args, procs, plat, one: tuple[str, int], requests, keys) -> list[dict]:
    """The whole workload at the highest concurrency through one gateway process and through
    two, in alternate windows."""
    port = free_port()
    two = procs.start(
        "gateway-2",
        [*gateway_argv(port), "--workers", "2", "--log-level", "warning"],
        "0,1" if os.cpu_count() and os.cpu_count() > 1 else "0",
    )
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health")
    gateways = {"1": one, "2": (url, two.pid)}
    concurrency = max(args.concurrency)
    rows = {"1": [], "2": []}
    for _, side in _turns(["1", "2"], args.process_rounds):
        gateway_url = gateways[side][0]
        host, gateway_port = urllib.parse.urlsplit(gateway_url)[1].split(":")
        payloads = workload.wire(requests, host, int(gateway_port), keys["keys"], keys["signing"])
        result = measure_platform(args, plat, gateways[side], payloads, concurrency)
        rows[side].append(result)
        print(_line(None, concurrency, f"{side} process(es)", result), flush=True)
    return [
        {"processes": side, "concurrency": concurrency, "rounds": results}
        for side, results in rows.items()
    ]


def profile(args, gateway: tuple[str, int], celery_pid: int, requests, keys) -> str:
    """py-spy's samples of the gateway and of Celery (its pool's processes too) under the whole
    workload, at once."""
    import threading

    url, pid = gateway
    host, port = urllib.parse.urlsplit(url)[1].split(":")
    payloads = workload.wire(requests, host, int(port), keys["keys"], keys["signing"])
    load = threading.Thread(
        target=lambda: asyncio.run(
            loadgen.drive(host, int(port), payloads, concurrency=8, warmup=0,
                          duration=args.profile + 3)
        )
    )  # fmt: skip
    load.start()
    time.sleep(1)
    samplers = {}
    for name, target, extra in (("gateway", pid, []), ("celery", celery_pid, ["--subprocesses"])):
        out = RUN_DIR / f"profile-realistic-{name}.txt"
        samplers[name] = out, py_spy_record(target, args.profile, out, *extra)
    for _, sampler in samplers.values():
        sampler.wait()
    load.join()
    return "\n".join(
        _top_frames(out, title=f"the {name}, the realistic workload at C=8", limit=20)
        for name, (out, _) in samplers.items()
    )


def _line(stream, concurrency, side, result) -> str:
    kind = {None: "mix", False: "json", True: "stream"}[stream]
    cpu = result.get("cpu_ms", {})
    parts = " ".join(f"{k} {v:.3f}" for k, v in cpu.items())
    return (
        f"{kind:6} C={concurrency:<3} {side:14} {result['rps']:7.0f} rps "
        f"p50 {result['p50_ms']:7.2f} p99 {result['p99_ms']:7.2f} "
        f"cpu {result['cpu_ms_per_request']:.3f} ms/req [{parts}] {result['statuses']}"
    )


# --- tables --------------------------------------------------------------------------------


def _med(results: list[dict], *path: str) -> float:
    values = []
    for result in results:
        value = result
        for name in path:
            value = value[name]
        values.append(value)
    return _median(values)


def _range(results: list[dict], *path: str) -> str:
    values = [r[path[0]][path[1]] if len(path) == 2 else r[path[0]] for r in results]
    return f"{min(values):.2f}-{max(values):.2f}"


def _ok_share(results: list[dict]) -> str:
    total = sum(sum(r["statuses"].values()) for r in results)
    good = sum(r["statuses"].get(200, 0) for r in results)
    return f"{100 * good / max(total, 1):.0f}%"


def markdown(rows, processes, summary, meta, yardsticks, profiled) -> str:
    lines = [
        f"# The platform on a realistic workload ({meta['date']}, commit {meta['commit']})",
        "",
        f"{meta['machine']}. `bench/realistic.py` (bench/workload.py's workload, described "
        "there): windows of "
        f"{meta['duration']} s after {meta['warmup']} s of warm-up, {meta['rounds']} "
        "rounds per point in rotating order; medians, with the platform's CPU range over the "
        "rounds. The upstream alone at C=1 does "
        f"{meta['upstream_c1_rps']:.0f} requests/s on this workload's non-streamed requests.",
        "",
        "The workload as drawn: "
        + ", ".join(f"{name} {share:.0%}" for name, share in summary["endpoints"].items())
        + f"; {summary['streamed']:.0%} streamed; request bodies p50 "
        f"{summary['body_bytes_p50']:,} B, p90 {summary['body_bytes_p90']:,} B, max "
        f"{summary['body_bytes_max']:,} B; {summary['distinct_keys']} keys seen, the hottest "
        f"{summary['hottest_key_share']:.1%} of requests, the top ten "
        f"{summary['top10_keys_share']:.0%}; requests of keys near their limits "
        f"{summary['near_limit_share']:.1%}, signed {summary['signed_share']:.1%}, of prepaid "
        f"tenants {summary['prepaid_share']:.0%}.",
        "",
        "CPU in ms per request. Platform = gateway + Redis + Celery (its drain into "
        "PostgreSQL, running); PostgreSQL's server beside it. Added p50 = the platform's p50 "
        "minus the upstream's alone. OK = share of 200 answers (keys near their limits get "
        "429s).",
        "",
        "| requests | C | platform CPU | (range) | gateway | Redis | Celery | PostgreSQL | "
        "added p50 ms | p99 ms | rps | OK |"
        + "".join(f" {y} CPU | {y} OK |" for y in yardsticks.values()),
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        + "---:|---:|" * len(yardsticks),
    ]
    for row in rows:
        dmx = row["rounds"]["dmx"]
        kind = "streamed" if row["stream"] else "non-streamed"
        cells = [
            kind,
            str(row["concurrency"]),
            f"{_med(dmx, 'cpu_ms', 'platform'):.2f}",
            _range(dmx, "cpu_ms", "platform"),
            *(f"{_med(dmx, 'cpu_ms', p):.2f}" for p in ("gateway", "redis", "celery", "postgres")),
            f"{_med(dmx, 'p50_ms') - row['direct']['p50_ms']:.2f}",
            f"{_med(dmx, 'p99_ms'):.2f}",
            f"{_med(dmx, 'rps'):.0f}",
            _ok_share(dmx),
        ]
        for name in yardsticks:
            theirs = row["rounds"][name]
            cells += [f"{_med(theirs, 'cpu_ms_per_request'):.2f}", _ok_share(theirs)]
        lines.append("| " + " | ".join(cells) + " |")
    if yardsticks:
        lines += ["", "Ratios of the medians (platform CPU / yardstick CPU):", ""]
        for row in rows:
            dmx = _med(row["rounds"]["dmx"], "cpu_ms", "platform")
            kind = "streamed" if row["stream"] else "non-streamed"
            lines.append(
                f"- {kind}, C={row['concurrency']}: "
                + ", ".join(
                    f"{label} {dmx / _med(row['rounds'][name], 'cpu_ms_per_request'):.3f}"
                    for name, label in yardsticks.items()
                )
            )
    if processes:
        one, two = (p["rounds"] for p in processes)
        lines += [
            "",
            f"Gateway processes, the whole workload at C={processes[0]['concurrency']} "
            "(one process on core 0; two on cores 0 and 1, which the upstream, the load "
            "generator, Redis, Celery and PostgreSQL share):",
            "",
            "| gateway processes | rps | platform CPU ms/req | gateway CPU ms/req | p50 ms | "
            "p99 ms | OK |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, results in (("1", one), ("2", two)):
            lines.append(
                f"| {name} | {_med(results, 'rps'):.0f} | "
                f"{_med(results, 'cpu_ms', 'platform'):.2f} | "
                f"{_med(results, 'cpu_ms', 'gateway'):.2f} | {_med(results, 'p50_ms'):.1f} | "
                f"{_med(results, 'p99_ms'):.1f} | {_ok_share(results)} |"
            )
        lines.append(
            f"\nTwo processes / one: {_med(two, 'rps') / _med(one, 'rps'):.2f}x the requests per "
            "second."
        )
    if profiled:
        lines += ["", profiled]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--process-rounds", type=int, default=4)
    parser.add_argument("--profile", type=int, default=10, help="seconds of py-spy; 0: none")
    parser.add_argument("--litellm", action="store_true")
    parser.add_argument("--portkey", action="store_true")
    parser.add_argument(
        "--pg",
        default=os.environ.get("DMX_CAPACITY_PG", "postgres://postgres@127.0.0.1:5432"),
        help="the PostgreSQL server for the scratch database",
    )
    parser.add_argument("--results", default="realistic")
    parser.add_argument(
        "--short-prompts",
        action="store_true",
        help="then bench/run.py's short-prompt points, with the same yardsticks and rounds",
    )
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.duration, args.rounds, args.process_rounds = 0.5, 1.5, 1, 2
        args.profile = min(args.profile, 2)

    gateway_core, other_core = _cores()
    rds = PrivateRedis(other_core)
    database = ScratchDatabase(args.pg)
    procs = None
    try:
        env = _env(0)
        env.update(
            REDIS_URL=f"redis://127.0.0.1:{rds.port}/0",
            DATABASE_URL=database.url,
            DMX_REDIS_PREFIX=PREFIX,
        )
        keys_file = RUN_DIR / "workload-keys.json"
        credentials = setup(env, workload_keys=keys_file)
        keys = json.loads(keys_file.read_text())
        keys["signing"] = {int(i): s.encode() for i, s in keys["signing"].items()}
        requests = workload.draw(REQUESTS, model=LONG_MODEL, embed_model=EMBED_MODEL)
        summary = workload.summary(requests, workload.KeyPlan.draw())
        procs = Processes(env)
        stack = start_fake_upstream_stack(
            procs,
            env,
            credentials,
            tokens=COMPLETION_CAP,
            ttft_ms=0,
            tpot_ms=0,
            with_celery=True,
            models={MODEL: 2048, LONG_MODEL: LONG_CONTEXT, EMBED_MODEL: EMBED_CONTEXT},
        )
        plat = Platform(rds, stack.celery.pid, database.url)
        gateway = (stack.gateway_url, stack.gateway.pid)
        yardsticks = [
            *([start_litellm(procs, stack.upstream_url, gateway_core)] if args.litellm else []),
            *([start_portkey(procs, stack.upstream_url, gateway_core)] if args.portkey else []),
        ]
        rows = yardstick_points(args, plat, gateway, requests, keys, yardsticks, stack.upstream_url)
        processes = process_points(args, procs, plat, gateway, requests, keys)
        profiled = profile(args, gateway, stack.celery.pid, requests, keys) if args.profile else ""
    finally:
        if procs:
            procs.stop()
        rds.stop()
        database.drop()
    meta = {
        "date": datetime.now(tz=UTC).strftime("%Y-%m-%d"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "warmup": args.warmup,
        "duration": args.duration,
        "rounds": args.rounds,
        "upstream_c1_rps": next(
            r["direct"]["rps"] for r in rows if not r["stream"] and r["concurrency"] == 1
        ) if 1 in args.concurrency else float("nan"),
    }  # fmt: skip
    labels = {y.name: y.label for y in yardsticks}
    text = markdown(rows, processes, summary, meta, labels, profiled)
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.results}.md").write_text(text)
        (RESULTS / f"{args.results}.json").write_text(
            json.dumps(
                {"meta": meta, "workload": summary, "points": rows, "processes": processes},
                indent=1,
            )
        )
    if args.short_prompts:
        short = [
            *(sys.executable, "bench/run.py", "--no-vllm", "--results", "yardsticks"),
            *("--concurrency", *map(str, args.concurrency), "--rounds", str(args.rounds)),
            *("--warmup", str(args.warmup), "--duration", str(args.duration)),
            *(["--litellm"] if args.litellm else []),
            *(["--portkey"] if args.portkey else []),
            *(["--quick"] if args.quick else []),
        ]
        subprocess.run(short, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
