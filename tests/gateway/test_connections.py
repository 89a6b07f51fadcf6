"""Every request a client sent reaches an answer, even when the gateway's process stalls past
the idle timeout of the connections the requests came on (issue 38).

uvicorn closed an idle keep-alive connection when its timer fired without reading it: after a
stall, the timer and the client's next request were due together, the timer ran first, and the
kernel reset the connection with the request unread (the client's `ReadError`, no response, no
log). 64 streams reuse 64 idle connections while the gateway is stopped past its keep-alive, as a
busy machine's scheduler stops it; each must end in a full stream and one usage record. The
same when the gateway is told to stop during the stall: uvicorn closed every idle connection at
shutdown, with the requests unread in them.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest

from apps.billing.models import UsageRecord
from tests.conftest import SERVED_MODELS
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

STREAMS = 64
# Short, so that the stall passes it in a second; the stall is what the test injects.
KEEPALIVE_SECONDS = 1
TOKENS = 4


def _body() -> dict:
    return {
        "model": SERVED_MODELS[0],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
    }


async def _stream(
    client: httpx.AsyncClient, sent: list[int] | None = None
) -> tuple[int, str, bytes]:
    """One streamed completion read to its end: status, request id, body. `sent` counts the
    requests whose body is in the kernel's socket (httpcore's trace)."""

    async def trace(event: str, info: dict) -> None:
        if sent is not None and event == "http11.send_request_body.complete":
            sent.append(1)

    request = client.build_request("POST", "/v1/chat/completions", json=_body())
    request.extensions["trace"] = trace
    response = await client.send(request, stream=True)
    try:
        body = await response.aread()
    finally:
        await response.aclose()
    return response.status_code, response.headers.get("x-request-id", ""), body


def _metric(url: str, name: str) -> float:
    text = call("GET", url + "/metrics").body.decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not in /metrics"
    return float(found.group(1))


@pytest.mark.parametrize("shutdown", [False, True], ids=["stall", "stall-then-stop"])
def test_requests_sent_on_idle_connections_while_the_gateway_stalls_are_all_answered(
    platform, committed, shutdown
):
    _, secret = make_api_key()
    # Told to stop, the gateway's idle timers play no part: they are the default's 75 s.
    keepalive = {} if shutdown else {"DMX_GATEWAY_KEEPALIVE_SECONDS": str(KEEPALIVE_SECONDS)}
    gateway, url = platform.stack.spare_gateway(
        f"gateway-stalled{'-stopped' if shutdown else ''}", settings=keepalive
    )

    async def scenario() -> list:
        limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
        async with httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {secret}"},
            limits=limits,
            timeout=120,
        ) as client:
            # 64 connections, each idle after its stream, its keep-alive timer armed.
            warm = await asyncio.gather(*(_stream(client) for _ in range(STREAMS)))
            assert [status for status, _, _ in warm] == [200] * STREAMS
            idle_since = time.monotonic()
            os.kill(gateway.process.pid, signal.SIGSTOP)
            try:
                sent: list[int] = []
                streams = [asyncio.ensure_future(_stream(client, sent)) for _ in range(STREAMS)]
                # Every request in its socket, and every connection's keep-alive past due.
                deadline = time.monotonic() + 30
                while len(sent) < STREAMS or time.monotonic() < idle_since + 2 * KEEPALIVE_SECONDS:
                    assert time.monotonic() < deadline, f"{len(sent)} of {STREAMS} requests sent"
                    await asyncio.sleep(0.05)
                if shutdown:
                    os.kill(gateway.process.pid, signal.SIGTERM)
            finally:
                os.kill(gateway.process.pid, signal.SIGCONT)
            return await asyncio.gather(*streams, return_exceptions=True)

    try:
        results = asyncio.run(scenario())
        if shutdown:  # uvicorn exits by the signal it stopped for, once it has stopped
            assert gateway.process.wait(timeout=60) == -signal.SIGTERM
        else:
            waiting = _metric(url, "dmx_gateway_keepalive_requests_waiting_total")
    finally:
        gateway.stop()

    failures = [repr(r) for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} of {STREAMS} requests got no response: {failures[:3]}"
    assert [status for status, _, _ in results] == [200] * STREAMS
    assert all(body.rstrip().endswith(b"data: [DONE]") for _, _, body in results)
    if not shutdown:  # the stall did cross the timers: they found requests waiting
        assert waiting >= 1
    request_ids = {request_id for _, request_id, _ in results}
    assert len(request_ids) == STREAMS
    records = wait_for(
        lambda: (
            found
            if len(found := list(UsageRecord.objects.filter(request_id__in=request_ids))) == STREAMS
            else None
        ),
        timeout=60,
        what=f"{STREAMS} usage records",
    )
    assert {(r.status, r.completion_tokens) for r in records} == {("ok", TOKENS)}
