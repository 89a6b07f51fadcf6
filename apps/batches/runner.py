"""A batch's lines through the gateway's pipeline, in the batch worker's own process.

Each line is a request as /v1 runs it (the key's limits and budgets, the content filter, intent,
the context check, routing, billing, a usage record naming the batch), over the in-process
exchange the portal's playground uses (apps.gateway.direct), at the batch tier and price. The
pipeline is asyncio and its runtime (Redis, the fleet's state, the routing table) lives on one
event loop, so each worker process keeps one loop in a thread of its own for all its batches; the
Celery task, synchronous, hands lines to it and records each answer as it comes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

import orjson

from apps.batches.choices import BatchEndpoint
from apps.batches.models import BatchLine
from apps.batches.services import Outcome
from apps.gateway.direct import call
from apps.gateway.schemas import Endpoint
from apps.keys.gate import KeyRecord

ENDPOINTS = {
    BatchEndpoint.CHAT: Endpoint.CHAT,
    BatchEndpoint.COMPLETIONS: Endpoint.COMPLETIONS,
    BatchEndpoint.RESPONSES: Endpoint.RESPONSES,
    BatchEndpoint.EMBEDDINGS: Endpoint.EMBEDDINGS,
}
_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's loop, started on first use (a forked pool child starts its own)."""
    global _loop
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="batch-runner", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def submit(key: KeyRecord, address: str, line: BatchLine) -> concurrent.futures.Future[Outcome]:
    """Start one line's try; its future gives what the pipeline answered."""
    return asyncio.run_coroutine_threadsafe(_run(key, address, line), _event_loop())


async def _run(key: KeyRecord, address: str, line: BatchLine) -> Outcome:
    # A batch's answers come whole: a line cannot stream, or run on in the background.
    url = line.url
    body = dict(line.body or {})
    body.pop("stream_options", None)
    if url != BatchEndpoint.EMBEDDINGS:
        body["stream"] = False
    if url == BatchEndpoint.RESPONSES:
        body["background"] = False
    caller = {"client": (address, 0), "headers": []} if address else {"headers": []}
    answer = await call(
        ENDPOINTS[BatchEndpoint(url)],
        body,
        key=key,
        caller=caller,
        batch_id=line.batch_id,
        request_id=line.request_id,
    )
    answered = bytes(answer.body)
    try:
        orjson.loads(answered)  # the output file holds it as it is: it must be JSON
    except orjson.JSONDecodeError:
        answered = orjson.dumps({"error": {"message": "Not JSON.", "type": "server_error"}})
    return Outcome(answer.status, answered, answer.retry_after)
