"""A closed-loop HTTP load generator: C connections, each sending its next request when the last
one finished; a warm-up, then a fixed measuring window; bounded in time.

Cheap per request (asyncio protocols and httptools, keep-alive connections, prebuilt request
bytes) so that it does not limit what it measures. Reports requests per second, latency
p50/p90/p99, and for streams the time to the first body chunk.

    python bench/loadgen.py --url http://127.0.0.1:8000/v1/chat/completions --key sk-dmx-… \
        --concurrency 8 --warmup 2 --duration 10 [--stream] [--tokens 16]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import urllib.parse
from dataclasses import dataclass, field

import httptools


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.first_body: float | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.done and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        if self.first_body is None:
            self.first_body = time.perf_counter()

    def on_message_complete(self) -> None:
        if self.done and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    def request(self, payload: bytes) -> asyncio.Future:
        self.first_body = None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.done


# Distinct prompts the requests cycle through, so that no cache along the way (a classifier's, a
# node's prefix cache) serves the benchmark better than it would serve real traffic.
DISTINCT_PROMPTS = 4096


def build_requests(
    url: str, key: str | None, body: dict, headers: dict[str, str] | None = None
) -> tuple[str, int, list[bytes]]:
    """Prebuilt requests: the body with its prompt varied DISTINCT_PROMPTS ways, with `headers`
    besides the usual ones."""
    parts = urllib.parse.urlsplit(url)
    payloads = []
    for i in range(DISTINCT_PROMPTS):
        varied = json.loads(json.dumps(body))
        if "messages" in varied:
            varied["messages"][-1]["content"] += f" ({i})"
        else:
            varied["prompt"] += f" ({i})"
        raw = json.dumps(varied).encode()
        head = [
            f"POST {parts.path} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(raw)}",
        ]
        if key:
            head.append(f"Authorization: Bearer {key}")
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        payloads.append(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
    return parts.hostname, parts.port, payloads


# Distinct numbers for requests built as they are sent, across every worker of a run.
_SERIALS = itertools.count()


async def _worker(host, port, payloads, stats: Stats, measure_from: float, until: float) -> None:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, host, port)
    sent = 0
    while True:
        started = time.perf_counter()
        if started >= until:
            break
        payload = payloads[(id(client) + sent) % len(payloads)]
        if not isinstance(payload, bytes):  # built as it is sent (a signed request)
            payload = payload.render(int(time.time()), next(_SERIALS))
        try:
            status = await client.request(payload)
        except ConnectionError:
            stats.errors += 1
            _, client = await loop.create_connection(Client, host, port)
            continue
        sent += 1
        finished = time.perf_counter()
        if started >= measure_from and finished <= until:
            stats.latencies.append(finished - started)
            if client.first_body is not None:
                stats.first_bytes.append(client.first_body - started)
            stats.statuses[status] = stats.statuses.get(status, 0) + 1
    client.transport.close()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(
    url: str,
    key: str | None,
    body: dict,
    *,
    concurrency: int,
    warmup: float,
    duration: float,
    headers: dict[str, str] | None = None,
) -> dict:
    host, port, payloads = build_requests(url, key, body, headers)
    return await drive(
        host, port, payloads, concurrency=concurrency, warmup=warmup, duration=duration
    )


async def drive(
    host: str, port: int, payloads: list, *, concurrency: int, warmup: float, duration: float
) -> dict:
    """Send `payloads` (request bytes, or objects whose render(now, serial) gives them) over
    `concurrency` connections, in turn, for `warmup` then `duration` seconds; the figures of
    the second window."""
    stats = Stats()
    start = time.perf_counter()
    measure_from, until = start + warmup, start + warmup + duration
    await asyncio.gather(
        *(_worker(host, port, payloads, stats, measure_from, until) for _ in range(concurrency))
    )
    count = len(stats.latencies)
    ms = 1000.0
    return {
        "concurrency": concurrency,
        "requests": count,
        "rps": count / duration,
        "p50_ms": _percentile(stats.latencies, 0.50) * ms,
        "p90_ms": _percentile(stats.latencies, 0.90) * ms,
        "p99_ms": _percentile(stats.latencies, 0.99) * ms,
        "max_ms": max(stats.latencies, default=0.0) * ms,
        "first_byte_p50_ms": _percentile(stats.first_bytes, 0.50) * ms,
        "first_byte_p99_ms": _percentile(stats.first_bytes, 0.99) * ms,
        "statuses": stats.statuses,
        "errors": stats.errors,
    }


def request_body(*, model: str, stream: bool, tokens: int, chat: bool = True) -> dict:
    body = {"model": model, "max_tokens": tokens, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": "Write a haiku about the sea."}]
    else:
        body["prompt"] = "Write a haiku about the sea."
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key")
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    body = request_body(model=args.model, stream=args.stream, tokens=args.tokens)
    import uvloop

    result = uvloop.run(
        run(
            args.url,
            args.key,
            body,
            concurrency=args.concurrency,
            warmup=args.warmup,
            duration=args.duration,
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
