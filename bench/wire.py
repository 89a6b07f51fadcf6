"""The node protocol's messages (inference/wire.py), encoded and parsed per second: this tree's
code against another revision's, side by side in one run.

    .venv/bin/python bench/wire.py [--against REV] [--rounds 5] [--seconds 1]

The payload is the one a GPU worker sends every few seconds: a heartbeat with an engine load
and the recorded 8 x H100 view (tests/inference/hardware), about 10 kB of JSON. Measured:
- encode: the worker's `heartbeat.to_dict()` and orjson, as inference/platform_client.py sends it;
- parse: the gateway's heartbeat endpoint, body bytes to a checked Heartbeat (apps.hardware
  .consumers: the revision's own way, `from_json` where it has one, else orjson and `from_dict`);
- view: the resource view's own parse, `NodeView.from_dict` (apps.hardware.resources).
Each side runs in its own process with its own `inference/` first on the path (the other
revision's taken out with `git archive`), alternately, `--rounds` times; the medians are
reported with their ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEASURE = """
import json, sys, time
import orjson
from inference.hardware.view import NodeView
from inference.wire import Heartbeat

body = open(sys.argv[1], "rb").read()
seconds = float(sys.argv[2])
parse_json = getattr(Heartbeat, "from_json", None) or (
    lambda raw: Heartbeat.from_dict(orjson.loads(raw))
)
heartbeat = parse_json(body)
resources = orjson.loads(body)["resources"]

def rate(work):
    for _ in range(50):
        work()
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(100):
            work()
        done += 100
    return done / elapsed

print(json.dumps({
    "encode": rate(lambda: orjson.dumps(heartbeat.to_dict())),
    "parse": rate(lambda: parse_json(body)),
    "view": rate(lambda: NodeView.from_dict(resources)),
}))
"""


def payload() -> bytes:
    import orjson

    from inference.hardware.detection import get_gpu_info
    from inference.wire import EngineLoad, Heartbeat
    from tests.inference.hardware.nvml_replay import H100_X8, replay

    heartbeat = Heartbeat(
        status="up",
        engine=EngineLoad(num_requests_running=12, num_requests_waiting=3, kv_cache_usage=0.41),
        resources=get_gpu_info(backend=replay(H100_X8)).to_dict(),
    )
    return orjson.dumps(heartbeat.to_dict())


def checkout(rev: str, into: Path) -> Path:
    """`inference/` as it was at `rev`, alone in a directory put first on the path."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "inference"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(path_first: Path, body_file: Path, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(path_first)}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(body_file), str(seconds)],
        env=env,
        cwd=path_first,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        body = payload()
        body_file = Path(tmp) / "heartbeat.json"
        body_file.write_bytes(body)
        sides = {args.against: checkout(args.against, Path(tmp) / "other"), "this tree": ROOT}
        results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, path in sides.items():
                results[side].append(measure(path, body_file, args.seconds))

    print(f"heartbeat, 8 x H100 view, {len(body):,} bytes of JSON; per second, median [range]")
    print(f"| operation | {' | '.join(sides)} | ratio |")
    print("|---|" + "---:|" * (len(sides) + 1))
    for operation in ("encode", "parse", "view"):
        medians = []
        cells = []
        for side in sides:
            rates = [round_[operation] for round_ in results[side]]
            medians.append(statistics.median(rates))
            cells.append(f"{medians[-1]:,.0f} [{min(rates):,.0f}-{max(rates):,.0f}]")
        print(f"| {operation} | {' | '.join(cells)} | {medians[1] / medians[0]:.2f}x |")


if __name__ == "__main__":
    main()
