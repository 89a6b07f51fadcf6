"""The gateway's CPU per Redis call: the lean clients (dmxplatform.resp) against redis-py's.

    .venv/bin/python bench/redis_clients.py [--calls 20000] [--concurrency 64] [--rounds 3]

Starts its own three-master Redis Cluster on loopback ports (tests/faults.OwnRedisCluster),
then sends the same script call, shaped like the admission script's (eight keys in one tenant's
slot, fourteen arguments, a small reply), through four clients: to one master, RespClient and
redis-py's asyncio Redis; to the cluster, ClusterRespClient and redis-py's asyncio RedisCluster.
`concurrency` calls are in flight at once, as a busy gateway has them. The figure is this
process's CPU time per call (time.process_time): what a gateway core pays, not what Redis
does. The clients take turns, `rounds` times each, and the median is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from dmxplatform.resp import ClusterRespClient, RespClient, Script
from tests.faults import OwnRedisCluster

SCRIPT = Script("return {1, 0, #KEYS, ARGV[1]}")
RULES = ("t:rpm", "t:tpm", "k:rpm", "k:tpm", "k:cc", "q:month", "q:day", "q:model")
KEYS = [f"dmxbench:{{s7}}:rl:{rule}" for rule in RULES]
ARGS = [f"{1_700_000_000 + i}" for i in range(14)]
TIMEOUT = 5.0


EXPECTED = [1, 0, len(KEYS), ARGS[0].encode()]


async def lean(client) -> list:
    return await client.run(SCRIPT, KEYS, ARGS)


async def redis_py(client) -> list:
    return await client.evalsha(SCRIPT.sha.decode(), len(KEYS), *KEYS, *ARGS)


async def measure(call, client, calls: int, concurrency: int) -> float:
    """Microseconds of this process's CPU per call, after a warm-up whose replies are checked."""
    for _ in range(200):
        reply = await call(client)
        if reply != EXPECTED:
            raise AssertionError(f"{type(client).__name__} answered {reply!r}")
    started = time.process_time()
    for _ in range(calls // concurrency):
        await asyncio.gather(*(call(client) for _ in range(concurrency)))
    return (time.process_time() - started) / (calls // concurrency * concurrency) * 1e6


async def bench(cluster: OwnRedisCluster, calls: int, concurrency: int, rounds: int) -> dict:
    port = cluster.ports[cluster.node_of(KEYS[0])]
    cluster_nodes = [ClusterNode("127.0.0.1", p) for p in cluster.ports]
    clients = {
        "one Redis: RespClient": (
            lean,
            RespClient(f"redis://127.0.0.1:{port}/0", timeout=TIMEOUT),
        ),
        "one Redis: redis-py asyncio Redis": (
            redis_py,
            Redis(host="127.0.0.1", port=port, socket_timeout=TIMEOUT),
        ),
        "cluster: ClusterRespClient": (lean, ClusterRespClient(cluster.url, timeout=TIMEOUT)),
        "cluster: redis-py asyncio RedisCluster": (
            redis_py,
            RedisCluster(startup_nodes=cluster_nodes, socket_timeout=TIMEOUT),
        ),
    }
    figures: dict[str, list[float]] = {name: [] for name in clients}
    try:
        # Every master has the script, as after a first EVAL.
        await clients["cluster: ClusterRespClient"][1].each_master(b"SCRIPT", b"LOAD", SCRIPT.body)
        for _ in range(rounds):
            for name, (call, client) in clients.items():
                figures[name].append(await measure(call, client, calls, concurrency))
    finally:
        for name, (_, client) in clients.items():
            await (client.close() if "RespClient" in name else client.aclose())
    return {name: statistics.median(values) for name, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dmx-bench-cluster-") as directory:
        cluster = OwnRedisCluster(Path(directory)).start()
        try:
            figures = asyncio.run(bench(cluster, args.calls, args.concurrency, args.rounds))
        finally:
            cluster.stop()
    print(f"{args.calls} script calls, {args.concurrency} in flight, median of {args.rounds}:")
    print("| client | µs of client CPU per call |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.1f} |")


if __name__ == "__main__":
    main()
