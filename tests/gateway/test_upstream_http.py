"""The pooled HTTP/1.1 client against real sockets: a small asyncio server per test."""

import asyncio
import contextlib
import socket
import threading

import pytest
import uvloop

from apps.gateway.upstream_http import HttpPool, UpstreamConnectionError


async def serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = int(next(line for line in lines if line.startswith(b"content-length")).split(b":")[1])
    return head + await reader.readexactly(length)


def pool(**overrides) -> HttpPool:
    settings = dict(connect_timeout=1.0, read_timeout=1.0, max_idle_per_node=4)
    settings.update(overrides)
    return HttpPool(**settings)


def test_json_body_and_connection_reuse():
    connections = []

    async def handler(reader, writer):
        connections.append(writer)
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            body = b'{"echo": %d}' % len(request)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def scenario():
        server, port = await serve(handler)
        client = pool()
        bodies = []
        for _ in range(3):
            response = await client.post(f"http://127.0.0.1:{port}/v1/completions", b'{"a": 1}')
            assert response.status == 200
            bodies.append(await response.read())
            response.release()
        await client.close()
        server.close()
        return bodies

    bodies = asyncio.run(scenario())
    assert len(bodies) == 3 and all(b.startswith(b'{"echo": ') for b in bodies)
    assert len(connections) == 1  # one keep-alive connection carried all three


def test_chunked_stream_arrives_piece_by_piece():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def scenario():
        server, port = await serve(handler)
        client = pool()
        response = await client.post(f"http://127.0.0.1:{port}/x", b"{}")
        pieces = [chunk async for chunk in response.chunks()]
        response.release()
        server.close()
        return pieces

    pieces = asyncio.run(scenario())
    assert b"".join(pieces) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert len(pieces) == 3  # not buffered into one


def test_a_stale_idle_connection_is_replaced_without_failing_the_request():
    served = []

    async def handler(reader, writer):
        await read_request(reader)
        served.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # the node's keep-alive timeout, right after answering

    async def scenario():
        server, port = await serve(handler)
        client = pool()
        first = await client.post(f"http://127.0.0.1:{port}/x", b"{}")
        await first.read()
        first.release()
        await asyncio.sleep(0.05)
        second = await client.post(f"http://127.0.0.1:{port}/x", b"{}")
        body = await second.read()
        second.release()
        server.close()
        return body

    assert asyncio.run(scenario()) == b"ok" and len(served) == 2


def test_silence_past_the_read_timeout_fails_the_response():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(2)

    async def scenario():
        server, port = await serve(handler)
        client = pool(read_timeout=0.2)
        response = await client.post(f"http://127.0.0.1:{port}/x", b"{}")
        received = []
        with pytest.raises(UpstreamConnectionError, match="read timeout"):
            async for chunk in response.chunks():
                received.append(chunk)
        response.release()
        server.close()
        return received

    assert asyncio.run(scenario()) == [b"hello"]


def test_nobody_listening():
    async def scenario():
        with pytest.raises(UpstreamConnectionError):
            await pool().post("http://127.0.0.1:1/x", b"{}")

    asyncio.run(scenario())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_node_closing_each_connection_at_once_fails_the_call_as_unreachable(loop):
    """A dead node's port that still accepts (a proxy in front of it, a listener with no
    worker): each connection closes as it opens. The gateway runs on uvloop, which can see the
    close before post() writes, and its transport then refuses the write with a RuntimeError
    (a 500 for the client) where the node's failure belongs (issue 30's CI run)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept():
        with contextlib.suppress(OSError):
            while True:
                listener.accept()[0].close()

    threading.Thread(target=accept, daemon=True).start()

    async def scenario():
        client = pool()
        failures = []
        for _ in range(50):
            with pytest.raises(UpstreamConnectionError) as failure:
                await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}")
            failures.append(failure.value)
        return failures

    try:
        failures = uvloop.run(scenario()) if loop == "uvloop" else asyncio.run(scenario())
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which then ends
        listener.close()
    assert len(failures) == 50


def test_closing_an_unfinished_response_closes_its_connection():

    async def scenario():
        seen = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            await reader.read()  # returns b"" when the client hangs up
            seen.set()

        server, port = await serve(handler)
        response = await pool().post(f"http://127.0.0.1:{port}/x", b"{}")
        response.close()
        await asyncio.wait_for(seen.wait(), 2)
        server.close()
        return True

    assert asyncio.run(scenario())


def test_a_request_called_off_before_the_answer_closes_its_connection():
    """Cancelled while the node has not answered yet, the request's connection is closed (the
    node sees EOF, and vLLM aborts the generation) instead of left open for no one."""
    node_saw_eof = []

    async def handler(reader, writer):
        await read_request(reader)
        node_saw_eof.append(await reader.read() == b"")  # waits for the client to hang up

    async def scenario():
        server, port = await serve(handler)
        client = pool(read_timeout=30.0)
        post = asyncio.create_task(client.post(f"http://127.0.0.1:{port}/x", b"{}"))
        await asyncio.sleep(0.1)
        post.cancel()
        with pytest.raises(asyncio.CancelledError):
            await post
        for _ in range(100):
            if node_saw_eof:
                break
            await asyncio.sleep(0.01)
        server.close()

    asyncio.run(scenario())
    assert node_saw_eof == [True]


def test_an_unstreamed_answer_may_take_the_requests_time_not_the_read_timeout():
    """vLLM answers an unstreamed request once it is generated: a long generation went silent
    past the read timeout, failed as a dead node's, and was retried elsewhere."""
    from apps.gateway.upstream_http import UpstreamTimeout

    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(0.6)  # generating: nothing to send until done
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()

    async def scenario():
        server, port = await serve(handler)
        client = pool(read_timeout=0.2)
        url = f"http://127.0.0.1:{port}/v1/completions"
        response = await client.post(url, b"{}", first_byte=5.0)
        body = await response.read()
        response.release()
        with pytest.raises(UpstreamTimeout):
            await client.post(url, b"{}", first_byte=0.3)  # the request's time runs out
        with pytest.raises(UpstreamConnectionError) as silent:
            await client.post(url, b"{}")  # a stream's first byte: the read timeout
        await client.close()
        server.close()
        return body, silent.value

    body, silent = asyncio.run(scenario())
    assert body == b"{}"
    assert not isinstance(silent, UpstreamTimeout)
