"""The gateway benchmark, run briefly as a smoke check: every path works end to end.

No timing is asserted (CI machines are shared and noisy); what is checked is that the benchmark
starts its processes, that every request through the gateway succeeds, and that it reports.
"""

import ast
import json
import re
import subprocess
import sys

import pytest

from tests.stack import ROOT

# By hand: these start their own stacks (bench/run.py), through no fixture conftest could see.
pytestmark = pytest.mark.e2e


def test_quick_benchmark_runs_every_point_through_the_gateway():
    result = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--no-vllm", "--concurrency", "1", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| (non-)?stream \|", line)]
    assert len(rows) == 4  # two concurrencies, streamed and not
    for line in result.stdout.splitlines():
        if line.startswith(("json", "stream")) and "statuses" in line:
            assert re.search(r"statuses \{200: \d+\}$", line), line  # nothing but 200s
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[2]) > 0 and float(cells[3]) > 0  # direct and gateway rps


def test_quick_large_prompt_benchmark_refuses_one_size_and_serves_the_other():
    result = subprocess.run(
        [sys.executable, "bench/large_prompts.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    phases = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("alone", "refused", "counted"):
        assert set(phases[name]["small"]["statuses"]) == {"200"}, phases[name]
    assert phases["refused"]["large"]["code"] == "context_length_exceeded"
    assert set(phases["refused"]["large"]["statuses"]) == {"400"}
    assert set(phases["counted, no small requests"]["large"]["statuses"]) == {"200"}


def test_redis_client_benchmark_runs_each_client_against_its_own_cluster():
    result = subprocess.run(
        [sys.executable, "bench/redis_clients.py", "--calls", "640", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(re.findall(r"^\| (one Redis: .+|cluster: .+) \| ([\d.]+) \|$", result.stdout, re.M))
    assert set(rows) == {
        "one Redis: RespClient",
        "one Redis: redis-py asyncio Redis",
        "cluster: ClusterRespClient",
        "cluster: redis-py asyncio RedisCluster",
    }
    assert all(float(value) > 0 for value in rows.values())


def test_quick_realistic_benchmark_serves_every_endpoint_and_counts_every_part():
    """The realistic workload through the whole platform: chat, Responses, Messages and
    embeddings, signed and prepaid keys, answered 200 (429 only for the keys near their
    limits), and the gateway's, Redis's, Celery's and PostgreSQL's CPU each counted."""
    result = subprocess.run(
        [
            *(sys.executable, "bench/realistic.py", "--quick"),
            *("--concurrency", "1", "--process-rounds", "2", "--profile", "0"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    windows = re.findall(
        r"^(json|stream|mix) +C=\d+ +(.+?) +\d+ rps .*\[gateway ([\d.]+) redis ([\d.]+) "
        r"celery ([\d.]+) postgres ([\d.]+) platform [\d.]+\] (\{.*\})$",
        result.stdout,
        re.M,
    )
    assert {(kind, side) for kind, side, *_ in windows} == {
        ("json", "dmx"),
        ("stream", "dmx"),
        ("mix", "1 process(es)"),
        ("mix", "2 process(es)"),
    }
    for *_, gateway, redis_cpu, celery, postgres, statuses in windows:
        assert all(float(v) > 0 for v in (gateway, redis_cpu, celery, postgres))
        counts = ast.literal_eval(statuses)  # printed as a dict of status: count
        assert set(counts) <= {200, 429}, counts
        assert counts.get(200, 0) > 10 * counts.get(429, 0)
    assert "Two processes / one:" in result.stdout
