"""Benchmark the intent classifier: artifact load time, classify latency by prompt length.

Run from the repository root: `.venv/bin/python bench/intent.py`. No Django: the intent package
imports only numpy. Prompts are the held-out, hand-written, realistic and real-prompt dev sets
(tools/intent/data) as written, plus the same prompts padded with prose to 1-8 KB (instruction
first or last), so a third of the calls pay for a long read. Targets (issues 19 and 34): p99
under 1 ms up to 1 KB, under 2 ms up to 8 KB, on one core.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.gateway.intent import classify, load
from apps.gateway.intent.model import ARTIFACT_PATH, IntentModel
from tools.intent.dataset import (
    HELDOUT_FILE,
    NATURAL_FILE,
    REAL_DEV_FILE,
    REALISTIC_FILE,
    load_examples,
)
from tools.intent.tables import load_table

PROMPTS = 3_000
LOADS = 5  # artifact reads timed after the first; the first also pays the cold page cache
WARMUP = 200  # calls before timing, so that numpy's first-call setup is not counted
LONG_CHARS = 8_192
SEED = 20260601
# Length buckets, in characters, for the report.
BUCKETS = ((0, 256), (257, 1_024), (1_025, 4_096), (4_097, LONG_CHARS))


def prompts(count: int, rng: random.Random) -> list[str]:
    """Return `count` prompts: real ones and, for a third of them, the same padded to 1-8 KB."""
    sets = (HELDOUT_FILE, NATURAL_FILE, REALISTIC_FILE, REAL_DEV_FILE)
    real = [e.prompt for name in sets for e in load_examples(name)]
    prose = [" ".join(p) for p in load_table("fillers_en")["passages"]]
    prose += ["".join(p) for p in load_table("fillers_zh")["passages"]]
    chosen = []
    for index in range(count):
        text = rng.choice(real)
        if index % 3 == 0:
            padding = ""
            length = rng.randint(1_024, LONG_CHARS)
            while len(padding) < length:
                padding += rng.choice(prose) + "\n\n"
            padding = padding[: max(0, length - len(text) - 2)]
            text = f"{text}\n\n{padding}" if rng.random() < 0.5 else f"{padding}\n\n{text}"
        chosen.append(text[:LONG_CHARS])
    return chosen


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def percentile(sorted_values: list[int], share: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    args = parser.parse_args()

    load_ns = []
    for _ in range(LOADS + 1):
        started = time.perf_counter_ns()
        IntentModel.load(ARTIFACT_PATH)
        load_ns.append(time.perf_counter_ns() - started)
    load()

    rng = random.Random(SEED)
    texts = prompts(args.prompts, rng)
    for text in texts[:WARMUP]:
        classify(text)
    timings: list[tuple[int, int]] = []
    for text in texts:
        started = time.perf_counter_ns()
        classify(text)
        timings.append((len(text), time.perf_counter_ns() - started))

    print(
        f"Intent classifier on {cpu_name()}, "
        f"Python {platform.python_version()}; artifact {ARTIFACT_PATH.stat().st_size / 1e6:.2f} MB"
    )
    print()
    print("| artifact load | ms |")
    print("|---|---:|")
    print(f"| first | {load_ns[0] / 1e6:.1f} |")
    print(f"| median of next {LOADS} | {sorted(load_ns[1:])[LOADS // 2] / 1e6:.1f} |")
    print()
    print("| prompt length (chars) | n | p50 µs | p99 µs | max µs |")
    print("|---|---:|---:|---:|---:|")
    rows = [
        (f"{low:,}-{high:,}", [ns for n, ns in timings if low <= n <= high])
        for low, high in BUCKETS
    ]
    rows.append(("all", [ns for _, ns in timings]))
    for name, values in rows:
        values.sort()
        if values:
            print(
                f"| {name} | {len(values)} | {percentile(values, 0.5) / 1e3:.0f} | "
                f"{percentile(values, 0.99) / 1e3:.0f} | {values[-1] / 1e3:.0f} |"
            )


if __name__ == "__main__":
    main()
