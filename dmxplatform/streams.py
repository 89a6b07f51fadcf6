"""Durable buffers: Redis streams the hot path appends to, drained into the database in batches.

The gateway appends with XADD (inside its settle script: no extra round trip); a Celery task
drains each stream through a consumer group, and acknowledges and deletes entries only after the
database committed them, so a crash or an outage anywhere in between leaves them pending, never
lost. Handlers insert idempotently on a natural key, so an entry read twice is stored once.

Only what an entry can be at fault for parks it (ENTRY_FAULTS); any other failure is the
database's, an outage, and leaves the batch pending. When a batch fails for an entry's fault,
it is stored one entry at a time, and an entry that fails on its own is parked, with the reason,
in a dead-letter stream beside the original, so that one bad entry can never hold back the ones
behind it (it once stopped the whole usage ledger). Parked entries are counted at /metrics
(dmxplatform.metrics) and listed in the admin, which puts them back once their cause is fixed.

Each kind of entry (a DurableStream) is one stream per request-store shard (StreamShard,
DMX_REQUEST_REDIS_SHARDS): a tenant's entries go to its shard's stream, in the hash slot of its
limits, since the settle script appends them in the same call on a Redis Cluster. Every shard
drains on its own, under its own lock, so Celery drains them in parallel. Drains, gauges and the
admin cover every shard number a gateway of the deployment has run with (shards_in_use), not
only today's setting: lowering DMX_REQUEST_REDIS_SHARDS would otherwise strand the entries of
the streams above the new number, which no drain would read again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction
from redis.exceptions import ResponseError

from dmxplatform.redis_client import REDIS_ERRORS, request_redis, rkey, shard_of, shard_tag
from dmxplatform.resp import ClusterRespClient, RespClient, Script

logger = logging.getLogger(__name__)

FIELD = b"e"
GROUP = "flush"
# Entries moved per round: one INSERT of this many rows is a few milliseconds on PostgreSQL.
BATCH = 500
# Rounds per drain, so that one Celery task stays well inside its time limit.
MAX_ROUNDS = 20
# A parked entry keeps this much of the error that parked it: enough for any database message.
REASON_CHARS = 500

# Receives (entry id, payload) pairs and stores them in one transaction; returns
# {entry id: reason} for entries it can tell are unreadable. Raises to refuse the batch: the
# drain then tells an outage (leave it pending) from a bad entry (park it).
Store = Callable[[list[tuple[bytes, bytes]]], dict[bytes, str]]

# Every kind of durable stream, by name, for the admin and /metrics.
REGISTRY: dict[str, DurableStream] = {}


@dataclass(frozen=True)
class DurableStream:
    name: tuple[str, ...]
    title: str = ""

    def __post_init__(self) -> None:
        REGISTRY[self.label] = self

    @property
    def label(self) -> str:
        return ".".join(self.name)

    def shard(self, number: int) -> StreamShard:
        return StreamShard(self, number)

    def of_tenant(self, tenant_id: int) -> StreamShard:
        """The stream a tenant's entries go to."""
        return self.shard(shard_of(tenant_id))


@dataclass(frozen=True)
class StreamShard:
    """One stream of a kind: what a drain empties, and what parks its bad entries."""

    stream: DurableStream
    number: int

    @property
    def label(self) -> str:
        return f"{self.stream.label}.{self.number}"

    @property
    def title(self) -> str:
        if self.number == 0 and settings.DMX_REQUEST_REDIS_SHARDS == 1:
            return self.stream.title
        return f"{self.stream.title} (shard {self.number})"

    def key(self) -> str:
        return rkey(shard_tag(self.number), *self.stream.name)

    def dead_letter_key(self) -> str:
        return rkey(shard_tag(self.number), *self.stream.name, "dead")

    def lock_id(self) -> int:
        """The drain's PostgreSQL advisory lock: a number that stays with the stream's name."""
        return zlib.crc32(f"dmx-drain:{self.label}".encode())


# Raises the number of shards gateways have run with to ARGV[1], never lowers it.
_RECORD_SHARDS = Script(
    """
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
if now > seen then
  redis.call('SET', KEYS[1], now)
  return now
end
return seen
"""
)


def _shards_seen_key() -> str:
    return rkey("request_store", "shards_seen")


async def record_shards(client: RespClient | ClusterRespClient) -> int:
    """Record that a gateway writes DMX_REQUEST_REDIS_SHARDS shards' streams (at its start);
    return the most any gateway has."""
    return await client.run(
        _RECORD_SHARDS, [_shards_seen_key()], [settings.DMX_REQUEST_REDIS_SHARDS]
    )


def shards_in_use() -> int:
    """How many shard numbers may hold entries: DMX_REQUEST_REDIS_SHARDS, or more where a
    gateway ran with more. The record is never lowered, since a gateway of the old setting may
    still be writing; a drain of an empty stream costs one read."""
    try:
        seen = int(request_redis().get(_shards_seen_key()) or 0)
    except REDIS_ERRORS:
        seen = 0  # the drains and the scrape will find Redis away on their own
    return max(settings.DMX_REQUEST_REDIS_SHARDS, seen)


def _fan_out_shards(task, shard: int | None) -> bool:
    """For a drain task run without a shard (by the beat): queue it once per shard in use, to
    drain their streams in parallel on every worker process of the ledger queue, and say so;
    False (nothing queued) when it was given its shard, or there is one, shard 0, which the
    caller drains itself."""
    if shard is not None:
        return False
    count = shards_in_use()
    if count == 1:
        return False
    for number in range(count):
        task.delay(number)
    return True


def drain_task(task, flush: Callable[..., int], shard: int | None) -> int:
    """A drain task's body: queued by the beat without a shard, it fans out (_fan_out_shards);
    given its shard, it drains it and, when that moved a whole task's worth (MAX_ROUNDS
    batches: more are likely waiting), queues itself again at once. The beat's cadence then
    paces a quiet stream only: a busy one drained at most MAX_ROUNDS x BATCH entries per
    DMX_USAGE_FLUSH_SECONDS, half of what one drain's CPU moves (bench/capacity.py)."""
    if _fan_out_shards(task, shard):
        return 0
    moved = flush(shard=shard or 0)
    if moved >= MAX_ROUNDS * BATCH:
        task.delay(shard or 0)
    return moved


def every_shard() -> list[StreamShard]:
    """Every stream of every kind that may hold entries (shards_in_use)."""
    count = shards_in_use()
    return [stream.shard(number) for stream in REGISTRY.values() for number in range(count)]


def shard_named(label: str) -> StreamShard | None:
    """The stream of a StreamShard.label, if it is one of this deployment's."""
    return next((shard for shard in every_shard() if shard.label == label), None)


def _ensure_group(client, stream: StreamShard) -> None:
    try:
        client.xgroup_create(stream.key(), GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def drain(
    stream: StreamShard, store: Store, *, consumer: str = "flusher", batch_size: int = BATCH
) -> int:
    """Move buffered entries into the database; return how many left the buffer.

    Entries this consumer read earlier but could not store (the database was down) are retried
    first. One drain per stream runs at a time across all Celery workers; a second call returns
    0 at once.
    """
    try:
        with _exclusive(stream) as held:
            return _drain_rounds(stream, store, consumer, batch_size) if held else 0
    except DatabaseError as exc:  # taking the lock: every store error is _store's to judge
        logger.warning("%s: the database failed (%s); entries wait", stream.key(), exc)
        return 0


def flush(
    stream: DurableStream,
    store: Store,
    *,
    shard: int | None = None,
    consumer: str = "flusher",
    batch_size: int = BATCH,
) -> int:
    """drain() one shard of a kind's streams, or (None) every one after the other; Celery
    drains them in parallel, a task per shard."""
    numbers = range(shards_in_use()) if shard is None else [shard]
    shards = [stream.shard(number) for number in numbers]
    return sum(drain(one, store, consumer=consumer, batch_size=batch_size) for one in shards)


def _drain_rounds(stream: StreamShard, store: Store, consumer: str, batch_size: int) -> int:
    client = request_redis()
    _ensure_group(client, stream)
    moved = 0
    for _ in range(MAX_ROUNDS):
        entries = _read(client, stream, consumer, batch_size)
        if not entries:
            break
        pairs = [(entry_id, fields.get(FIELD) or b"") for entry_id, fields in entries]
        outcome = _store(stream, store, pairs)
        if outcome is None:
            break
        stored, rejected = outcome
        _settle(client, stream, stored, rejected)
        moved += len(stored) - len(rejected)
        if len(stored) < len(pairs) or len(entries) < batch_size:
            break
    return moved


@contextlib.contextmanager
def _exclusive(stream: StreamShard) -> Iterator[bool]:
    """Hold the stream's drain lock for the block; yield whether it was free.

    The lock lives with the database the drain writes to and dies with its holder: a
    PostgreSQL session advisory lock (gone with the connection), or, on SQLite, a file lock
    beside the database file (gone with the process). It was a Redis key with a two-minute
    expiry, which outlived its holder: Redis killed mid-drain reloaded the key from its
    append-only file, and no drain ran until it expired while the records piled up.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [stream.lock_id()])
            held = cursor.fetchone()[0]
        try:
            yield held
        finally:
            if held:
                # A connection the database dropped took the lock with it.
                with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [stream.lock_id()])
        return
    path = Path(connection.settings_dict["NAME"]).with_name(f".{stream.label}.drain.lock")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


# What an entry can be at fault for: a value no column holds (DataError: a NUL byte, text past
# its column), a row that refers to something gone (IntegrityError: a deleted key), a payload
# the store cannot read (ValueError, TypeError, KeyError). Anything else fails every entry alike
# and is the database's (OperationalError: down, read-only after a failover, a full disk, a lock
# timeout; ProgrammingError: a migration not applied): then the batch waits, parking nothing.
ENTRY_FAULTS = (DataError, IntegrityError, ValueError, TypeError, KeyError)


def _store(
    stream: StreamShard, store: Store, pairs: list[tuple[bytes, bytes]]
) -> tuple[list[tuple[bytes, bytes]], dict[bytes, str]] | None:
    """Store a batch; return the pairs dealt with and the reasons of those to park, or None
    when the database failed the batch for a reason of its own (everything stays pending)."""
    try:
        return pairs, _attempt(store, pairs)
    except ENTRY_FAULTS:
        pass  # some entry is bad: find it, one entry at a time
    except Exception as exc:
        logger.warning(
            "%s: the database failed (%s); %d entries wait", stream.key(), exc, len(pairs)
        )
        return None
    done: list[tuple[bytes, bytes]] = []
    rejected: dict[bytes, str] = {}
    for pair in pairs:
        try:
            rejected.update(_attempt(store, [pair]))
        except ENTRY_FAULTS as exc:
            rejected[pair[0]] = f"{exc.__class__.__name__}: {exc}"
        except Exception as exc:
            logger.warning("%s: the database failed (%s); entries wait", stream.key(), exc)
            return done, rejected
        done.append(pair)
    return done, rejected


def _attempt(store: Store, pairs: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    # In a transaction (a savepoint when the caller has one), so that a failed statement
    # leaves the connection usable for the next attempt.
    with transaction.atomic():
        return store(pairs)


def _read(client, stream: StreamShard, consumer: str, batch_size: int) -> list:
    # "0" re-reads this consumer's unacknowledged entries; ">" takes new ones.
    for start in ("0", ">"):
        response = client.xreadgroup(GROUP, consumer, {stream.key(): start}, count=batch_size)
        entries = response[0][1] if response else []
        if entries:
            return entries
    return []


def _settle(
    client, stream: StreamShard, pairs: list[tuple[bytes, bytes]], rejected: dict[bytes, str]
) -> None:
    """Acknowledge and delete a stored batch; park what can never be stored, with why."""
    if not pairs:
        return
    pipe = client.pipeline(transaction=True)
    parked_at = str(time.time())
    for entry_id, payload in pairs:
        if entry_id in rejected:
            reason = rejected[entry_id][:REASON_CHARS]
            pipe.xadd(
                stream.dead_letter_key(),
                {FIELD: payload, b"id": entry_id, b"reason": reason, b"at": parked_at},
            )
    ids = [entry_id for entry_id, _ in pairs]
    pipe.xack(stream.key(), GROUP, *ids)
    pipe.xdel(stream.key(), *ids)
    pipe.execute()
    for entry_id in rejected:
        logger.error(
            "%s: entry %s parked in the dead-letter stream: %s",
            stream.key(),
            entry_id.decode(),
            rejected[entry_id][:REASON_CHARS],
        )


@dataclass(frozen=True)
class ParkedEntry:
    id: bytes  # in the dead-letter stream
    original_id: str
    reason: str
    parked_at: float
    payload: bytes


def parked(stream: StreamShard, *, count: int = 100) -> list[ParkedEntry]:
    """The newest entries parked in a stream's dead-letter stream, newest first."""
    return [
        ParkedEntry(
            id=entry_id,
            original_id=fields.get(b"id", b"").decode(errors="replace"),
            reason=fields.get(b"reason", b"").decode(errors="replace"),
            parked_at=float(fields.get(b"at", b"0") or 0),
            payload=fields.get(FIELD, b""),
        )
        for entry_id, fields in request_redis().xrevrange(stream.dead_letter_key(), count=count)
    ]


def parked_count(stream: StreamShard) -> int:
    return request_redis().xlen(stream.dead_letter_key())


# Parked entries read per call when all of them are put back or discarded.
PARKED_PAGE = 1000


def _all_parked(client, stream: StreamShard) -> list[bytes]:
    ids, start = [], "-"
    while page := client.xrange(stream.dead_letter_key(), min=start, count=PARKED_PAGE):
        ids.extend(entry_id for entry_id, _ in page)
        start = "(" + page[-1][0].decode()
    return ids


def parked_requeue(stream: StreamShard, ids: list[bytes] | None = None) -> int:
    """Put parked entries (all of them when `ids` is None) back on their stream, their cause
    fixed; return how many."""
    client = request_redis()
    moved = 0
    for entry_id in _all_parked(client, stream) if ids is None else ids:
        found = client.xrange(stream.dead_letter_key(), min=entry_id, max=entry_id)
        if not found:
            continue
        pipe = client.pipeline(transaction=True)
        pipe.xadd(stream.key(), {FIELD: found[0][1].get(FIELD, b"")})
        pipe.xdel(stream.dead_letter_key(), entry_id)
        pipe.execute()
        moved += 1
    return moved


def parked_discard(stream: StreamShard, ids: list[bytes] | None = None) -> int:
    """Delete parked entries (all of them when `ids` is None) for good; return how many."""
    client = request_redis()
    ids = _all_parked(client, stream) if ids is None else ids
    return client.xdel(stream.dead_letter_key(), *ids) if ids else 0
