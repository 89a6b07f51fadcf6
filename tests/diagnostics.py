"""What an end-to-end test that timed out waiting on the platform leaves in its report: the
state of the durable streams, Celery's queues, the database's locks and busy sessions, and the
tail of Celery's log (tests/conftest.py adds it to the failure). A wait on a drain that ran out
on a loaded CI machine once left nothing to tell which part had stalled."""

from __future__ import annotations

from django.db import DatabaseError, connection
from redis.exceptions import RedisError

from dmxplatform import streams
from dmxplatform.queues import Queue
from dmxplatform.redis_client import request_redis, sync_redis
from tests.stack import LOG_DIR

_LOCKS = """
SELECT l.pid, l.objid, l.granted, a.state, now() - a.xact_start, left(a.query, 100)
FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND a.datname = current_database()
"""
_BUSY = """
SELECT pid, wait_event_type, wait_event, now() - query_start, left(query, 120)
FROM pg_stat_activity
WHERE datname = current_database() AND state NOT IN ('idle') AND pid <> pg_backend_pid()
"""


def platform_state(log_lines: int = 25) -> str:
    """A few lines per part; a part that cannot be read says why instead."""
    return "\n".join([*_streams(), *_queues(), *_database(), *_celery_log(log_lines)])


def _streams() -> list[str]:
    lines = ["durable streams (length, pending, parked):"]
    try:
        client = request_redis()
        for shard in streams.every_shard():
            try:
                pending = client.xpending(shard.key(), streams.GROUP)["pending"]
            except RedisError:
                pending = "no group"
            length, parked = client.xlen(shard.key()), client.xlen(shard.dead_letter_key())
            lines.append(f"  {shard.label}: {length}, {pending}, {parked}")
    except RedisError as exc:
        lines.append(f"  unreadable: {exc}")
    return lines


def _queues() -> list[str]:
    try:
        client = sync_redis()
        return ["celery queues: " + ", ".join(f"{q.value} {client.llen(q.value)}" for q in Queue)]
    except RedisError as exc:
        return [f"celery queues unreadable: {exc}"]


def _database() -> list[str]:
    lines = []
    try:
        with connection.cursor() as cursor:
            for title, query in (("advisory locks", _LOCKS), ("busy sessions", _BUSY)):
                cursor.execute(query)
                lines += [f"{title}:", *(f"  {row}" for row in cursor.fetchall())]
    except DatabaseError as exc:
        lines.append(f"database unreadable: {exc}")
    return lines


def _celery_log(count: int) -> list[str]:
    try:
        tail = (LOG_DIR / "celery.log").read_text(errors="replace").splitlines()[-count:]
    except OSError as exc:
        return [f"celery log unreadable: {exc}"]
    return ["celery log, last lines:", *tail]
