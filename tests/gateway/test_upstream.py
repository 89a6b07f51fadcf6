"""A stream's head read until the node has answered (apps.gateway.upstream.stream_answered),
against a real socket: a small asyncio server writes what vLLM would, then fails or goes on."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from apps.gateway.upstream import stream_answered
from apps.routing.dispatcher import NodeFailed
from tests.gateway.test_upstream_http import pool, read_request, serve

NODE = SimpleNamespace(name="node-1")
ROLE = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
REFUSED = b'data: {"error":{"message":"bad logit_bias","code":400}}\n\n'
CRASHED = b'data: {"error":{"message":"engine dead","code":500}}\n\n'
DONE = b"data: [DONE]\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _answered(events: list[bytes], *, then: bytes | None) -> tuple[bytes | None, str]:
    """Serve `events` (then `then` and the end, or a close when None); return what the
    relay reads after stream_answered, or None and NodeFailed's message."""
    release = asyncio.Event()

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for event in events:
            writer.write(_chunk(event))
        await writer.drain()
        if then is None:
            writer.close()
            return
        await release.wait()  # the rest only once the head was judged
        writer.write(_chunk(then) + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    http = pool()
    try:
        response = await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}")
        try:
            await stream_answered(response, NODE)
        except NodeFailed as failed:
            return None, failed.error.message
        release.set()
        return await response.read(), ""
    finally:
        server.close()
        await http.close()


def test_a_stream_is_answered_at_its_second_event_and_the_relay_reads_it_all():
    body, _ = asyncio.run(_answered([ROLE, TOKEN], then=DONE))
    assert body == ROLE + TOKEN + DONE


def test_its_end_after_one_event_is_an_answer():
    body, _ = asyncio.run(_answered([ROLE, DONE], then=b""))
    assert body == ROLE + DONE


def test_a_refusal_of_the_request_is_left_to_the_relay_to_answer():
    body, _ = asyncio.run(_answered([ROLE, REFUSED], then=b""))
    assert body == ROLE + REFUSED


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([ROLE], "node-1 failed before it answered"),
        ([], "node-1 failed before it answered"),
        ([ROLE, CRASHED], "engine dead"),
    ],
    ids=["closed-after-role", "closed-before-any", "server-error-event"],
)
def test_a_node_failing_before_it_answered_raises_node_failed(events, message):
    body, failure = asyncio.run(_answered(events, then=None))
    assert body is None
    assert message in failure
