"""/metrics of a gateway of two processes: every scrape, whichever process answers it, counts
what both served (prometheus_client's multiprocess mode).

Apart from tests/dmxplatform/test_metrics.py, whose tests use the database: a module marked so
runs before the suite's transactional tests, which empty the database under a platform started
for it (the e2e stack's seed with it)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

from tests.http import call
from tests.stack import wait_for


def _count(body: str, status: str) -> float:
    pattern = (
        r'^dmx_gateway_request_duration_seconds_count\{endpoint="chat.completions",'
        rf'status="{status}",stream="false"\}} (\S+)$'
    )
    match = re.search(pattern, body, re.M)
    return float(match.group(1)) if match else 0.0


def _served_by_process(directory: Path) -> dict[str, float]:
    """Each process's own count of refused chat requests, read from the file it writes."""
    counts = {}
    for path in directory.glob("histogram_*.db"):
        pid = path.stem.rsplit("_", 1)[1]
        counts[pid] = sum(
            value
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path))
            # Each process writes a count per bucket, not cumulative: their sum is its count.
            if '"dmx_gateway_request_duration_seconds_bucket"' in key and '"401"' in key
        )
    return counts


def test_metrics_sum_across_two_gateway_processes(platform, tmp_path: Path):
    """Two worker processes behind one port; every scrape, whichever process answers it,
    counts the requests both served."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    gateway, url = platform.stack.spare_gateway(
        "gateway-two-processes",
        settings={"DMX_GATEWAY_WORKERS": "2", "PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    try:

        def refused(_) -> int:  # no key: refused at auth, and counted
            return call("POST", url + "/v1/chat/completions", json_body={}).status

        # The kernel hands connections to whichever process accepts first, and a quick one
        # may take a whole burst: send bursts until both have served some (bounded).
        requests, by_process = 0, {}
        with ThreadPoolExecutor(8) as pool:
            while requests < 2_000 and not (len(by_process) == 2 and all(by_process.values())):
                assert set(pool.map(refused, range(40))) == {401}
                requests += 40
                by_process = _served_by_process(directory)
        assert len(by_process) == 2 and all(by_process.values()), by_process
        # A request's duration is observed as its handler returns, after its client has the
        # answer: the last of a burst may be counted a moment later (CI once read 319 of 320).
        wait_for(
            lambda: sum(_served_by_process(directory).values()) == requests,
            timeout=10,
            interval=0.05,
            what=f"each of the {requests} requests counted by the process that served it",
        )
        for _ in range(6):
            assert _count(call("GET", url + "/metrics").body.decode(), "401") == requests
    finally:
        gateway.stop()
