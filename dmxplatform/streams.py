"""Durable buffers: Redis streams the hot path appends to, drained into the database in batches.

The gateway appends with XADD (inside its settle script: no extra round trip); a Celery task
drains each stream through a consumer group, and acknowledges and deletes entries only after the
database committed them, so a crash or an outage anywhere in between leaves them pending, never
lost. Handlers insert idempotently on a natural key, so an entry read twice is stored once.
Entries that can never be stored go to a dead-letter stream beside the original.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError
from redis.exceptions import ResponseError

from dmxplatform.redis_client import rkey, sync_redis

logger = logging.getLogger(__name__)

FIELD = b"e"
GROUP = "flush"
# Entries moved per round: one INSERT of this many rows is a few milliseconds on PostgreSQL.
BATCH = 500
# Rounds per drain, so that one Celery task stays well inside its time limit.
MAX_ROUNDS = 20
# Longer than the slowest drain; a drainer that died frees the lock after this.
LOCK_SECONDS = 120

# Receives (entry id, payload) pairs; returns the ids that can never be stored. Raises
# DatabaseError to leave the whole batch pending.
Store = Callable[[list[tuple[bytes, bytes]]], list[bytes]]


@dataclass(frozen=True)
class DurableStream:
    name: tuple[str, ...]

    def key(self) -> str:
        return rkey(*self.name)

    def dead_letter_key(self) -> str:
        return rkey(*self.name, "dead")

    def lock_key(self) -> str:
        return rkey(*self.name, "lock")


def _ensure_group(client, stream: DurableStream) -> None:
    try:
        client.xgroup_create(stream.key(), GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def drain(
    stream: DurableStream, store: Store, *, consumer: str = "flusher", batch_size: int = BATCH
) -> int:
    """Move buffered entries into the database; return how many left the buffer.

    Entries this consumer read earlier but could not store (the database was down) are retried
    first. One drain per stream runs at a time across all Celery workers; a second call returns
    0 at once.
    """
    client = sync_redis()
    lock = client.lock(stream.lock_key(), timeout=LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        return 0
    try:
        _ensure_group(client, stream)
        moved = 0
        for _ in range(MAX_ROUNDS):
            entries = _read(client, stream, consumer, batch_size)
            if not entries:
                break
            pairs = [(entry_id, fields.get(FIELD) or b"") for entry_id, fields in entries]
            try:
                rejected = set(store(pairs))
            except DatabaseError:
                logger.warning(
                    "%s: database unavailable; %d entries wait", stream.key(), len(pairs)
                )
                break
            _settle(client, stream, pairs, rejected)
            moved += len(pairs) - len(rejected)
            if len(entries) < batch_size:
                break
        return moved
    finally:
        lock.release()


def _read(client, stream: DurableStream, consumer: str, batch_size: int) -> list:
    # "0" re-reads this consumer's unacknowledged entries; ">" takes new ones.
    for start in ("0", ">"):
        response = client.xreadgroup(GROUP, consumer, {stream.key(): start}, count=batch_size)
        entries = response[0][1] if response else []
        if entries:
            return entries
    return []


def _settle(client, stream: DurableStream, pairs: list[tuple[bytes, bytes]], rejected: set) -> None:
    """Acknowledge and delete a stored batch; park what can never be stored."""
    pipe = client.pipeline(transaction=True)
    for entry_id, payload in pairs:
        if entry_id in rejected:
            pipe.xadd(stream.dead_letter_key(), {FIELD: payload, b"id": entry_id})
    ids = [entry_id for entry_id, _ in pairs]
    pipe.xack(stream.key(), GROUP, *ids)
    pipe.xdel(stream.key(), *ids)
    pipe.execute()
    if rejected:
        logger.error("%s: %d entries moved to the dead-letter stream", stream.key(), len(rejected))
