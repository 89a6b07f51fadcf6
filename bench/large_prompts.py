"""What prompts of megabytes cost everyone else: small requests' latency while they arrive,
against the same load without them, and the gateway's memory afterwards.

    .venv/bin/python bench/large_prompts.py [--duration 20] [--large-mb 8] [--tree DIR]

One gateway pinned to core 0 (as bench/run.py starts it: its own database and Redis, 10,000
sensitive terms, every limit checked) in front of the fake upstream. Small chat requests run
closed-loop at C=4 throughout; three phases, each `--duration` seconds:

- alone: the small requests only;
- refused: one client also sends an 8 MB prompt (pasted text: this repository's README over and
  over) to a model with a 2,048-token context, the next as soon as the last is answered;
- counted: a 1.2 MB prompt of the same text to a model with a 1M-token context, which it fits
  (about 880,000 tokens of the tiny model's 678-token vocabulary, 1.37 characters a token), so
  it is screened, classified, tokenized and sent on.

`--tree DIR` runs the gateway from another checkout (for example the commit before a change,
with its C extension copied in) against the same everything else.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import (
    MODEL,
    RESULTS,
    ROOT,
    Processes,
    _env,
    measure,
    rss_mb,
    setup,
    start_fake_upstream_stack,
)
from bench.setup_platform import LONG_CONTEXT, LONG_MODEL

SMALL_CONCURRENCY = 4


def large_body(model: str, megabytes: float) -> bytes:
    """A chat body of `megabytes` (JSON escapes included), pasted text in its user message."""
    size = int(megabytes * 1024 * 1024)
    text = (ROOT / "README.md").read_text()
    pasted = (text * (size // len(text) + 1))[:size]
    while True:
        body = json.dumps(
            {
                "model": model,
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"Summarise this document:\n\n{pasted}"},
                ],
                "max_tokens": 16,
            }
        ).encode()
        if len(body) <= size:
            return body
        pasted = pasted[: len(pasted) - (len(body) - size) - 1]


class LargeSender(threading.Thread):
    """Sends one large request after another until stopped; keeps their latencies and codes."""

    def __init__(self, url: str, key: str, body: bytes) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.body = url, key, body
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.sample = ""  # the first answer's error code, for the table

    def run(self) -> None:
        while not self.stop.is_set():
            request = urllib.request.Request(
                self.url,
                data=self.body,
                method="POST",
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
            )
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    response.read()
                    status = response.status
            except urllib.error.HTTPError as error:
                answer = error.read()
                status = error.code
                if not self.sample:
                    self.sample = json.loads(answer)["error"]["code"]
            except OSError:
                status = 0
            self.latencies.append((time.perf_counter() - started) * 1000)
            self.statuses[status] = self.statuses.get(status, 0) + 1


def phase(
    args, key: str, gateway_url: str, gateway_pid: int, large: bytes | None, *, small: bool = True
) -> dict:
    sender = None
    if large is not None:
        sender = LargeSender(gateway_url + "/v1/chat/completions", key, large)
        sender.start()
    if small:
        figures = measure(
            gateway_url + "/v1/chat/completions",
            key,
            stream=False,
            concurrency=SMALL_CONCURRENCY,
            tokens=16,
            warmup=2,
            duration=args.duration,
            cpu_pids=[gateway_pid],
        )
    else:
        time.sleep(args.duration)
        figures = None
    result = {"small": figures, "rss_mb": rss_mb(gateway_pid)}
    if sender is not None:
        sender.stop.set()
        sender.join(timeout=180)
        lat = sorted(sender.latencies)
        result["large"] = {
            "sent": len(lat),
            "statuses": sender.statuses,
            "code": sender.sample,
            "p50_ms": lat[len(lat) // 2] if lat else None,
        }
    time.sleep(3)  # the last large request's memory, once it is done
    result["rss_after_mb"] = rss_mb(gateway_pid)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--large-mb", type=float, default=8.0)  # the body cap: 8 MiB
    parser.add_argument("--counted-mb", type=float, default=1.2)
    parser.add_argument("--redis-db", type=int, default=11)
    parser.add_argument("--tree", type=Path, help="run the gateway from this checkout")
    parser.add_argument("--results", default="large_prompts")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: short phases, a JSON line, no file"
    )
    args = parser.parse_args()
    if args.quick:
        args.duration = 1.0

    env = _env(args.redis_db)
    credentials = setup(env)
    procs = Processes(env)
    try:
        stack = start_fake_upstream_stack(
            procs,
            env,
            credentials,
            tokens=16,
            ttft_ms=0,
            tpot_ms=0,
            with_celery=False,
            models={MODEL: 2048, LONG_MODEL: LONG_CONTEXT},
            gateway_tree=args.tree.resolve() if args.tree else None,
        )
        pid, url, key = stack.gateway.pid, stack.gateway_url, credentials["key"]
        started_rss = rss_mb(pid)
        phases = {
            "alone": phase(args, key, url, pid, None),
            "refused": phase(args, key, url, pid, large_body(MODEL, args.large_mb)),
            "counted": phase(args, key, url, pid, large_body(LONG_MODEL, args.counted_mb)),
            # What a counted prompt takes when it has the core to itself.
            "counted, no small requests": phase(
                args, key, url, pid, large_body(LONG_MODEL, args.counted_mb), small=False
            ),
        }
    finally:
        procs.stop()
    table = markdown(phases, started_rss, args)
    print(table)
    if args.quick:
        print(json.dumps(phases))
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.results}.md").write_text(table)


def markdown(phases: dict, started_rss: float, args) -> str:
    lines = [
        f"Small requests at C={SMALL_CONCURRENCY} for {args.duration:g} s per phase, while one "
        f"client sends {args.large_mb:.1f} MB prompts (refused) or {args.counted_mb:.1f} MB "
        "prompts (counted) back to back"
        + (f"; gateway from {args.tree}" if args.tree else "")
        + f". Gateway RSS at start {started_rss:.0f} MB.",
        "",
        "| phase | small rps | small p50 ms | small p99 ms | small max ms | large sent | "
        "large answers | large p50 ms | RSS at end MB | RSS 3 s later MB |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, result in phases.items():
        small, large = result["small"], result.get("large") or {}
        figures = (
            f"{small['rps']:.0f} | {small['p50_ms']:.2f} | {small['p99_ms']:.2f} | "
            f"{small['max_ms']:.2f}"
            if small
            else "| | |"
        )
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(large.get("statuses", {}).items()))
        if large.get("code"):
            answers += f" (`{large['code']}`)"
        p50 = large.get("p50_ms")
        lines.append(
            f"| {name} | {figures} | {large.get('sent', '')} | {answers} | "
            f"{'' if p50 is None else f'{p50:.0f}'} | {result['rss_mb']:.0f} | "
            f"{result['rss_after_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
