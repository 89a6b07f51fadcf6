"""A lean asyncio Redis client for the request path: RESP over one pipelined connection.

redis-py's asyncio client spends about 100 microseconds of CPU on a GET and over 200 on an
EVALSHA with a dozen arguments (command packing, retry wrappers, timeouts built on wait_for);
a gateway that makes two such calls per request can afford neither. This client packs commands
with one bytes join, parses replies with hiredis, and pipelines every concurrent caller over a
single connection, replies matched to callers in order. Commands issued in one turn of the event
loop leave in one write: one syscall for all the requests in flight, not one per command. It
does only what the hot path needs: plain commands and Lua scripts. The background work (state
refresh, pub/sub) keeps redis-py.

ClusterRespClient speaks to a Redis Cluster the same way: one RespClient per master, each
command sent to the master of its key's hash slot, MOVED and ASK redirections followed.

A call that times out (give or take a quarter of the timeout) closes the connection, since its
reply may still come and would be taken for the next caller's; the next call reconnects. A
connect that times out makes the calls after it fail at once for one timeout, rather than each
wait its own: a server that drops packets must not hold every caller for a timeout apiece (a
refused connect costs nothing, and is tried again by the next call).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import hiredis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

log = logging.getLogger(__name__)

_CRLF = b"\r\n"


# Error replies of a server that is up but cannot serve commands now.
_NOT_SERVING = ("LOADING ", "MASTERDOWN ", "BUSY ")


class RespError(Exception):
    """An error reply from Redis (the command ran and failed)."""


class RedisUnavailable(ConnectionError):
    """No connection, a lost one, or no reply in time."""


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"1" if value else b"0"
    if isinstance(value, int | float):
        return repr(value).encode()
    raise TypeError(f"cannot send {type(value).__name__} to Redis")


def pack(args: tuple | list) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    append = parts.append
    for arg in args:
        kind = arg.__class__
        data = arg if kind is bytes else arg.encode() if kind is str else _encode(arg)
        append(b"$%d\r\n" % len(data))
        append(data)
        append(_CRLF)
    return b"".join(parts)


class Script:
    """A Lua script sent by its SHA1, and by its body the first time a server lacks it."""

    __slots__ = ("body", "sha")

    def __init__(self, body: str) -> None:
        self.body = body.encode()
        self.sha = hashlib.sha1(self.body).hexdigest().encode()


class _Protocol(asyncio.Protocol):
    """One connection. Replies come in the order of the commands, so the oldest waiter is the
    only one that can be late: a watchdog checks it, instead of a timer per command."""

    def __init__(self, timeout: float) -> None:
        self.reader = hiredis.Reader(replyError=RespError)
        self.waiters: deque[tuple[asyncio.Future, float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.timeout = timeout
        self._watchdog: asyncio.TimerHandle | None = None
        self._outbox: list[bytes] = []
        self.scripts: set[bytes] = set()  # loaded on this connection by submit()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._watch()

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            waiter, _ = self.waiters.popleft()
            if not waiter.done():
                if isinstance(reply, RespError):
                    # A server that cannot serve yet (still loading its data after a restart,
                    # a replica without its master, a script running too long) is unavailable,
                    # as one that does not answer: the caller's 503, not a failed command.
                    if str(reply).startswith(_NOT_SERVING):
                        waiter.set_exception(RedisUnavailable(str(reply)))
                    else:
                        waiter.set_exception(reply)
                else:
                    waiter.set_result(reply)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        while self.waiters:
            waiter, _ = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(RedisUnavailable(f"Redis connection lost: {exc}"))

    def send(self, payload: bytes, *, now: bool = False) -> asyncio.Future:
        """Queue a command for this loop turn's write, or write it (and what is queued before
        it) `now`."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if self.closed:
            # Lost already (a server that accepts and hangs up at once, as a restarting one or
            # a proxy before it does): no reply and no watchdog will come for this command.
            waiter.set_exception(RedisUnavailable("Redis connection lost"))
            return waiter
        self.waiters.append((waiter, loop.time() + self.timeout))
        if not self._outbox and not now:
            loop.call_soon(self._flush)
        self._outbox.append(payload)
        if now:
            self._flush()
        return waiter

    def _flush(self) -> None:
        if not self._outbox:
            return  # written early by a send(now=True)
        payload = b"".join(self._outbox)
        self._outbox.clear()
        if not self.closed:
            self.transport.write(payload)

    @property
    def buffered(self) -> bool:
        """Whether bytes written are still in this process (the kernel's buffer was full)."""
        return bool(self.transport.get_write_buffer_size())

    def _watch(self) -> None:
        """Every quarter timeout: if the oldest command is overdue, give up on the connection
        (its late reply would be read as the next caller's)."""
        loop = asyncio.get_running_loop()
        if self.waiters and self.waiters[0][1] < loop.time():
            self.closed = True  # at once: no new call may queue behind the overdue one
            while self.waiters:
                waiter, _ = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(RedisUnavailable("Redis did not answer in time"))
            self.transport.close()
            return
        self._watchdog = loop.call_later(self.timeout / 4, self._watch)


def _plain_redis(parts) -> None:
    """Refuse what these clients would connect to in another way than asked (rediss://
    would silently lose its TLS)."""
    if parts.scheme != "redis":
        raise ValueError(f"the request path's Redis clients speak redis:// only: {parts.scheme}")


class RespClient:
    def __init__(self, url: str, *, timeout: float) -> None:
        parts = urlsplit(url)
        _plain_redis(parts)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._password = unquote(parts.password) if parts.password else None
        self._username = unquote(parts.username) if parts.username else None
        self._db = int(parts.path.lstrip("/") or 0)
        self._timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._down_until = 0.0  # a connect failed: calls fail at once until then

    @property
    def connected(self) -> bool:
        return self._protocol is not None and not self._protocol.closed

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if not self.connected:
                if time.monotonic() < self._down_until:
                    raise RedisUnavailable(
                        f"Redis at {self._host}:{self._port} is down (a connect just failed)"
                    )
                self._protocol = await self._open()
            return self._protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self._timeout), self._host, self._port),
                self._timeout,
            )
        except TimeoutError as exc:
            # Only a connect that timed out (a server that drops packets) holds the next callers
            # off; a refused one cost nothing, and Redis restarting answers the next one.
            self._down_until = time.monotonic() + self._timeout
            raise RedisUnavailable(f"cannot connect to Redis at {self._host}:{self._port}") from exc
        except OSError as exc:
            raise RedisUnavailable(f"cannot connect to Redis at {self._host}:{self._port}") from exc
        setup = []
        if self._password:
            auth = (
                ("AUTH", self._username, self._password)
                if self._username
                else ("AUTH", self._password)
            )
            setup.append(auth)
        if self._db:
            setup.append(("SELECT", self._db))
        for command in setup:
            await self._send(protocol, command)
        return protocol

    async def _send(self, protocol: _Protocol, args: tuple | list) -> Any:
        return await protocol.send(pack(args))

    async def execute(self, *args: Any) -> Any:
        return await self._send(await self._connection(), args)

    async def run(self, script: Script, keys: list, args: list) -> Any:
        """EVALSHA the script; load it with EVAL when the server does not have it."""
        protocol = await self._connection()
        return await self._script_reply(
            protocol.send(_evalsha(script, keys, args)), script, keys, args
        )

    async def submit(self, script: Script, keys: list, args: list) -> Awaitable[Any]:
        """Run the script like run(), but return as soon as the call is in the kernel's socket
        buffer (not this process's), with its reply to await later.

        What the kernel holds reaches Redis even if this process dies the next instant; when the
        kernel's buffer is full, this waits for the reply instead. The script is loaded once per
        connection first, so a restarted server runs the call as sent; only a SCRIPT FLUSH on a
        live connection leaves it to the EVAL sent when the reply is awaited."""
        protocol = await self._connection()
        if script.sha not in protocol.scripts:
            await protocol.send(pack((b"SCRIPT", b"LOAD", script.body)))
            protocol.scripts.add(script.sha)
        waiter = protocol.send(_evalsha(script, keys, args), now=True)
        reply = self._script_reply(waiter, script, keys, args)
        if not protocol.buffered:
            return reply
        done = asyncio.get_running_loop().create_future()
        done.set_result(await reply)
        return done

    async def _script_reply(
        self, waiter: asyncio.Future, script: Script, keys: list, args: list
    ) -> Any:
        try:
            return await waiter
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self.execute(*_eval(script, keys, args))

    async def after_asking(self, *args: Any) -> Any:
        """Send ASKING and the command back to back on one connection, as a node importing a
        slot serves a command of it only right after ASKING; return the command's reply."""
        protocol = await self._connection()
        _, reply = await asyncio.gather(
            protocol.send(pack((b"ASKING",))), protocol.send(pack(args))
        )
        return reply

    async def each_master(self, *args: Any) -> list:
        """Run a keyless command on every master: this server; its reply or its error as a
        value, as ClusterRespClient gives each of its masters'."""
        try:
            return [await self.execute(*args)]
        except (RespError, RedisUnavailable) as exc:
            return [exc]

    async def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
            self._protocol = None


def _evalsha(script: Script, keys: list, args: list) -> bytes:
    return pack((b"EVALSHA", script.sha, len(keys), *keys, *args))


Address = tuple[str, int]

# Redirections one command follows before it gives up: a MOVED fixes the map for its slot, an
# ASK sends it once to the node importing the slot, so two are the most a migration needs.
_REDIRECTS = 3
# Seconds between slot-map refreshes asked for by failures: a dead master's tenants must not
# have every one of their requests ask the other masters for the map.
_REMAP_INTERVAL = 1.0
# Commands without a key (the rest name theirs first): sent to any master that answers.
_KEYLESS = frozenset((b"PING", b"CONFIG", b"INFO", b"CLUSTER", b"SCRIPT"))
# Errors of a cluster that cannot serve the slot now: the request fails closed, as with a
# lost connection.
_UNAVAILABLE = ("CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN")


def seed_nodes(url: str) -> tuple[list[Address], str | None, str | None]:
    """The nodes and credentials of a cluster URL: redis://[user:password@]host:port[,...]."""
    parts = urlsplit(url)
    _plain_redis(parts)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes = []
    for node in hosts.split(","):
        one = urlsplit(f"//{node.strip()}")
        nodes.append((one.hostname or "127.0.0.1", one.port or 6379))
    return nodes, unquote(username) or None, unquote(password) or None


class ClusterRespClient:
    """RespClient's interface on a Redis Cluster: each command goes to the master of its key's
    hash slot (a script's keys must share one), over one pipelined RespClient per master.

    The slot map comes from CLUSTER SLOTS. A MOVED reply fixes the map and the command follows
    it; an ASK sends the command once to the importing node. A master that cannot be reached
    fails only the commands of its slots (RedisUnavailable), and has the map refreshed (a
    replica may have taken over) in the background, at most once per _REMAP_INTERVAL: only a
    client with no map yet waits for one.
    """

    def __init__(self, url: str, *, timeout: float) -> None:
        self._seeds, self._username, self._password = seed_nodes(url)
        self._timeout = timeout
        self._nodes: dict[Address, RespClient] = {}
        self._owners: list[Address | None] = []  # by slot; empty until mapped
        self._stale = False
        self._mapped_at = 0.0  # when a refresh last ended, read or not
        self._generation = 0  # maps read so far
        self._mapping: asyncio.Lock | None = None
        self._remapping: asyncio.Task | None = None

    async def execute(self, *args: Any) -> Any:
        if len(args) < 2 or _encode(args[0]).upper() in _KEYLESS:
            return await self._any(args)
        return await self._routed(key_slot(_encode(args[1])), args, lambda n: n.execute(*args))

    async def run(self, script: Script, keys: list, args: list) -> Any:
        return await self._routed(
            _slot(keys), _eval(script, keys, args), lambda node: node.run(script, keys, args)
        )

    async def submit(self, script: Script, keys: list, args: list) -> Awaitable[Any]:
        """RespClient.submit on the slot's master; a redirection met when the reply comes
        reruns the script where it leads (the first call did not run)."""
        slot = _slot(keys)
        address = await self._owner(slot)
        try:
            pending = await self._node(address).submit(script, keys, args)
        except RedisUnavailable:
            self._stale = True
            raise
        except RespError as exc:  # answered already (the socket's buffer was full): redirected
            self._redirection(exc, address, slot)
            done = asyncio.get_running_loop().create_future()
            done.set_result(await self.run(script, keys, args))
            return done
        return self._redirected(pending, address, slot, script, keys, args)

    async def each_master(self, *args: Any) -> list:
        """Run a keyless command on every master: their replies, and the errors of those that
        failed, as values."""
        await self._mapped()
        return list(
            await asyncio.gather(
                *(self._node(a).execute(*args) for a in self._masters()), return_exceptions=True
            )
        )

    async def close(self) -> None:
        if self._remapping is not None:
            self._remapping.cancel()
        for node in self._nodes.values():
            await node.close()
        self._nodes.clear()

    async def _routed(
        self, slot: int, plain: tuple, send: Callable[[RespClient], Awaitable[Any]]
    ) -> Any:
        """send() to the slot's master, following redirections; `plain` is the command as
        after_asking() sends it."""
        address = await self._owner(slot)
        asking = False
        for _ in range(_REDIRECTS):
            node = self._node(address)
            try:
                return await (node.after_asking(*plain) if asking else send(node))
            except RedisUnavailable:
                self._stale = True
                raise
            except RespError as exc:
                address, asking = self._redirection(exc, address, slot)
        raise RedisUnavailable(f"Redis Cluster: slot {slot} still redirected after {_REDIRECTS}")

    async def _redirected(
        self,
        pending: Awaitable[Any],
        address: Address,
        slot: int,
        script: Script,
        keys: list,
        args: list,
    ) -> Any:
        try:
            return await pending
        except RedisUnavailable:
            self._stale = True
            raise
        except RespError as exc:
            self._redirection(exc, address, slot)
            return await self.run(script, keys, args)

    def _redirection(self, exc: RespError, address: Address, slot: int) -> tuple[Address, bool]:
        """Where a MOVED or ASK error sends the command, and whether it is an ASK. Raise
        RedisUnavailable for a cluster that cannot serve the slot now, the error itself for
        any other."""
        kind, *rest = str(exc).split()
        if kind in _UNAVAILABLE:
            self._stale = True
            raise RedisUnavailable(f"Redis Cluster: {exc}") from exc
        if kind not in ("MOVED", "ASK"):
            raise exc
        host, _, port = rest[1].rpartition(":")
        target = (host or address[0], int(port))  # no host: the node that answered
        if kind == "MOVED":
            self._owners[slot] = target
            self._stale = True  # its neighbours most likely moved with it
        return target, kind == "ASK"

    async def _any(self, args: tuple) -> Any:
        """A keyless command on the first master that answers, connected ones first: one dead
        master must not make the others look down (readiness)."""
        await self._mapped()
        failure: RedisUnavailable | None = None
        for address in self._masters():
            try:
                return await self._node(address).execute(*args)
            except RedisUnavailable as exc:
                failure = exc
        self._stale = True
        raise failure or RedisUnavailable("Redis Cluster: no master is mapped")

    async def _owner(self, slot: int) -> Address:
        await self._mapped()
        address = self._owners[slot]
        if address is None:
            raise RedisUnavailable(f"Redis Cluster: no master serves slot {slot}")
        return address

    async def _mapped(self) -> None:
        """Have a slot map: wait for the first; refresh a stale one in the background."""
        if not self._owners:
            await self._map()
        elif (
            self._stale
            and time.monotonic() - self._mapped_at > _REMAP_INTERVAL
            and (self._remapping is None or self._remapping.done())
        ):
            self._remapping = asyncio.create_task(self._remap())

    async def _remap(self) -> None:
        try:
            await self._map()
        except RedisUnavailable as exc:
            log.warning("Redis Cluster: slot map not refreshed: %s", exc)
        except Exception:  # a task nobody awaits: its failure is said here, or never
            log.exception("Redis Cluster: slot map not refreshed")

    def _masters(self) -> list[Address]:
        """The mapped masters, those with a live connection first."""
        masters = dict.fromkeys(address for address in self._owners if address is not None)
        return sorted(masters, key=lambda address: not self._node(address).connected)

    async def _map(self) -> None:
        """Read the slot map from the first node that gives it: connected masters first, then
        the other masters and the seeds. Drop the clients of nodes no longer in it."""
        if self._mapping is None:
            self._mapping = asyncio.Lock()
        generation = self._generation
        async with self._mapping:
            if self._generation != generation:
                return  # mapped by the caller this one waited for
            known = sorted(
                dict.fromkeys([*self._masters(), *self._seeds]),
                key=lambda address: not self._node(address).connected,
            )
            try:
                for address in known:
                    try:
                        reply = await self._node(address).execute(b"CLUSTER", b"SLOTS")
                    except (RedisUnavailable, RespError) as exc:
                        log.warning("Redis Cluster node %s:%s gave no slot map: %s", *address, exc)
                        continue
                    self._owners = _slot_owners(reply, address)
                    self._stale = False
                    self._generation += 1
                    await self._forget(set(self._owners) | set(self._seeds))
                    return
            finally:
                self._mapped_at = time.monotonic()
            if not self._owners:
                raise RedisUnavailable(f"no node of the Redis Cluster answers: {known}")

    async def _forget(self, keep: set) -> None:
        """Close the clients of nodes neither mapped nor seeds (failed over, moved away)."""
        for address in [address for address in self._nodes if address not in keep]:
            await self._nodes.pop(address).close()

    def _node(self, address: Address) -> RespClient:
        node = self._nodes.get(address)
        if node is None:
            host, port = address
            auth = ""
            if self._password:
                user, password = (
                    quote(self._username or "", safe=""),
                    quote(self._password, safe=""),
                )
                auth = f"{user}:{password}@"
            netloc = f"[{host}]" if ":" in host else host
            url = f"redis://{auth}{netloc}:{port}/0"
            node = self._nodes[address] = RespClient(url, timeout=self._timeout)
        return node


def _slot(keys: list) -> int:
    """A script's slot: its first key's. Redis refuses keys across slots (CROSSSLOT), so the
    others need no check here."""
    if not keys:
        raise ValueError("a script on a Redis Cluster needs a key to be routed by")
    return key_slot(_encode(keys[0]))


def _eval(script: Script, keys: list, args: list) -> tuple:
    return (b"EVAL", script.body, len(keys), *keys, *args)


def _slot_owners(reply: list, asked: Address) -> list[Address | None]:
    """The master of each slot, from a CLUSTER SLOTS reply (an empty or unknown host: the node
    asked)."""
    owners: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
    for start, end, master, *_replicas in reply:
        # No endpoint (empty, "?" or none at all, as cluster-preferred-endpoint-type allows).
        host = master[0].decode() if master[0] not in (None, b"", b"?") else asked[0]
        owners[start : end + 1] = [(host, int(master[1]))] * (end - start + 1)
    return owners
