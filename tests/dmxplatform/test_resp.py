"""The request path's Redis client against a real server."""

import asyncio
import socket
import uuid

import pytest
from django.conf import settings

from dmxplatform.redis_client import resp_client, sync_redis
from dmxplatform.resp import RedisUnavailable, RespClient, RespError, Script, _Protocol, pack
from tests.faults import OwnRedis
from tests.stack import wait_for


def run(scenario):
    async def main():
        client = resp_client()
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(main())


@pytest.fixture
def key():
    name = f"dmxtest-resp-{uuid.uuid4().hex}"
    yield name
    sync_redis().delete(name)


def test_pack_is_resp():
    expected = b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$3\r\n0.5\r\n"
    assert pack((b"SET", "k", 12, 0.5)) == expected


def test_commands_use_the_configured_database(key):
    run(lambda c: c.execute("SET", key, "v"))
    assert sync_redis().get(key) == b"v"  # the same database as redis-py's REDIS_URL


def test_concurrent_callers_get_their_own_replies(key):
    async def scenario(client):
        return await asyncio.gather(*(client.execute("INCR", key) for _ in range(200)))

    assert sorted(run(scenario)) == list(range(1, 201))


def test_error_replies_raise_and_the_connection_carries_on(key):
    async def scenario(client):
        await client.execute("SET", key, "text")
        with pytest.raises(RespError, match="not an integer"):
            await client.execute("INCR", key)
        return await client.execute("GET", key)

    assert run(scenario) == b"text"


def test_scripts_are_loaded_when_the_server_lacks_them(key):
    script = Script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")

    async def scenario(client):
        first = await client.run(script, [key], [5])  # NOSCRIPT, then EVAL
        second = await client.run(script, [key], [5])  # EVALSHA
        return first, second

    assert run(scenario) == (5, 10)


def test_a_silent_server_times_out_and_the_next_call_reconnects(key):
    async def scenario(client):
        blocker = RespClient(settings.REDIS_URL, timeout=0.2)
        with pytest.raises(RedisUnavailable):
            await blocker.execute("BLPOP", key + "-never", 5)
        await blocker.execute("SET", key, "after")
        await blocker.close()

    run(scenario)
    assert sync_redis().get(key) == b"after"


def test_nobody_listening_is_unavailable():
    async def scenario(_):
        client = RespClient("redis://127.0.0.1:1/0", timeout=0.5)
        with pytest.raises(RedisUnavailable):
            await client.execute("PING")

    run(scenario)


@pytest.fixture
def dropping_server():
    """A loopback address whose SYNs are dropped, as a server behind a network that loses
    packets: a listener with a full accept queue (Linux drops a SYN the queue has no room for,
    rather than refusing it), so a connect to it times out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = []
    for _ in range(16):  # fill the queue until a connect is left hanging
        sock = socket.socket()
        sock.settimeout(0.2)
        queued.append(sock)
        try:
            sock.connect(listener.getsockname())
        except TimeoutError:
            break
    else:
        raise AssertionError("the kernel accepted 16 connects into a queue of one")
    host, port = listener.getsockname()
    yield f"redis://{host}:{port}/0"
    for sock in queued:
        sock.close()
    listener.close()


def test_a_connect_that_timed_out_fails_the_next_calls_at_once_for_one_timeout(dropping_server):
    async def scenario(_):
        client = RespClient(dropping_server, timeout=0.5)
        with pytest.raises(RedisUnavailable, match="cannot connect"):
            await client.execute("PING")  # waited the timeout for a connect
        with pytest.raises(RedisUnavailable, match="a connect just failed"):
            await client.execute("PING")  # did not wait: the window holds it off
        await asyncio.sleep(0.6)
        with pytest.raises(RedisUnavailable, match="cannot connect"):
            await client.execute("PING")  # the window is over: it tried to connect again

    run(scenario)


def test_a_refused_connect_holds_nobody_off(tmp_path):
    """Redis restarting refuses connects until it listens: the first call after it is back is
    served, not turned away by an earlier refusal."""
    server = OwnRedis(tmp_path, appendonly=False)

    async def scenario(_):
        client = RespClient(server.url, timeout=0.5)
        with pytest.raises(RedisUnavailable, match="cannot connect"):
            await client.execute("PING")
        server.start()
        try:
            assert await client.execute("PING") == b"PONG"
        finally:
            await client.close()
            server.kill()

    run(scenario)


def test_a_command_on_a_connection_already_lost_fails_at_once():
    """A connection can be lost between two commands of one call (submit's SCRIPT LOAD and its
    EVALSHA, a proxy or a restarting server hanging up): the second must fail, not wait for a
    reply that cannot come while nothing watches for it any more."""

    async def scenario(_):
        protocol = _Protocol(timeout=60)
        protocol.connection_lost(ConnectionResetError("reset by peer"))
        waiter = protocol.send(b"PING")
        assert waiter.done()
        with pytest.raises(RedisUnavailable):
            await asyncio.wait_for(waiter, 1)

    run(scenario)


def test_a_submitted_script_has_left_the_process_when_submit_returns(key):
    """What submit hands back is only the reply: the call is already in the kernel, so it runs
    even when the connection is torn down at once, as in a process that dies then; a script
    the server has never seen is loaded before, not after (NOSCRIPT would need a second send)."""
    script = Script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")

    async def scenario(client):
        await client.execute("SET", key, 1)  # connected
        reply = await client.submit(script, [key], [10])
        client._protocol.transport.abort()  # nothing in this process is sent after this
        with pytest.raises(RedisUnavailable):
            await reply

    run(scenario)
    wait_for(lambda: sync_redis().get(key) == b"11", timeout=5, what="the submitted call to run")


def test_submit_answers_like_run_and_loads_a_missing_script(key):
    script = Script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")

    async def scenario(client):
        first = await client.submit(script, [key], [5])  # SCRIPT LOAD first
        second = await client.submit(script, [key], [5])
        sync_redis().script_flush()  # the connection does not know: NOSCRIPT, then EVAL
        third = await client.submit(script, [key], [5])
        return await first, await second, await third

    assert run(scenario) == (5, 10, 15)


@pytest.mark.parametrize(
    "reply",
    [
        b"-LOADING Redis is loading the dataset in memory\r\n",
        b"-BUSY Redis is busy running a script. "
        b"You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n",
        b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
    ],
)
def test_a_server_that_cannot_serve_yet_is_unavailable_not_an_error(reply):
    """Redis's own error replies while it loads its data after a restart (the moment a
    restarted request store answers first), runs a long script or lost its master: the caller
    refuses with a retryable 503 rather than failing the request. The server here answers every
    command with that reply, as Redis does in that state."""

    async def scenario(_):
        async def answer(reader, writer):
            while await reader.read(65536):
                writer.write(reply)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RespClient(f"redis://127.0.0.1:{port}/0", timeout=2)
        try:
            with pytest.raises(RedisUnavailable, match=reply[1:8].decode()):
                await client.execute("GET", "k")
        finally:
            await client.close()
            server.close()

    run(scenario)
