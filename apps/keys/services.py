"""Writes for tenants, keys and the usage ledger."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from redis.exceptions import ResponseError

from apps.keys import ledger
from apps.keys.keycache import invalidation_channel, invalidation_message, record_key
from apps.keys.models import KEY_PREFIX, ApiKey, Tenant, UsageRecord
from apps.keys.selectors import key_record_from_row
from dmxplatform import credentials
from dmxplatform.redis_client import rkey, sync_redis

logger = logging.getLogger(__name__)

# Events moved per round: one INSERT of this many rows is a few milliseconds on PostgreSQL.
USAGE_FLUSH_BATCH = 500
# Rounds per flush call, so that one Celery task stays well inside its time limit.
USAGE_FLUSH_MAX_ROUNDS = 20
# Longer than the slowest flush; a flusher that died frees the lock after this.
USAGE_FLUSH_LOCK_SECONDS = 120


def tenant_create(*, name: str, slug: str) -> Tenant:
    tenant = Tenant(name=name, slug=slug)
    tenant.full_clean()
    tenant.save()
    return tenant


def api_key_publish(key: ApiKey) -> None:
    """Write a key's record to Redis and tell every gateway, once the transaction commits."""
    record = key_record_from_row(key)

    def publish() -> None:
        client = sync_redis()
        pipe = client.pipeline(transaction=False)
        pipe.set(record_key(key.key_id), record.encode())
        pipe.publish(invalidation_channel(), invalidation_message(key.key_id))
        pipe.execute()

    transaction.on_commit(publish)


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    allowed_models: list[str] | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key; return it and its plaintext, which is never stored nor shown again."""
    issued = credentials.issue(KEY_PREFIX)
    key = ApiKey(
        tenant=tenant,
        name=name,
        created_by=created_by,
        key_id=issued.credential_id,
        secret_hash=issued.secret_hash,
        allowed_models=list(allowed_models or []),
        expires_at=expires_at,
    )
    key.full_clean()
    key.save()
    api_key_publish(key)
    return key, issued.plaintext


def api_key_update(*, key: ApiKey) -> ApiKey:
    """Save edits made to a key (admin, portal) and push them to every gateway."""
    key.full_clean()
    key.save()
    api_key_publish(key)
    return key


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key; every gateway refuses it within a second."""
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    api_key_publish(key)
    return key


def _usage_row(event: ledger.UsageEvent) -> UsageRecord:
    return UsageRecord(
        request_id=event.request_id,
        api_key_id=event.api_key_id,
        tenant_id=event.tenant_id,
        created_at=datetime.fromtimestamp(event.created_at, tz=UTC),
        endpoint=event.endpoint,
        model=event.model,
        model_version=event.model_version,
        node=event.node,
        stream=event.stream,
        status=event.status,
        http_status=event.http_status,
        error_code=event.error_code,
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        duration_ms=event.duration_ms,
        time_to_first_token_ms=event.time_to_first_token_ms,
        timings=event.timings,
    )


def _usage_insert(entries: list[tuple[bytes, ledger.UsageEvent]]) -> list[bytes]:
    """Insert events; return the ids of entries that can never be inserted (bad references)."""
    rows = [_usage_row(event) for _, event in entries]
    try:
        with transaction.atomic():
            _check_constraints_now()
            UsageRecord.objects.bulk_create(rows, ignore_conflicts=True)
        return []
    except IntegrityError:
        pass
    # One row refers to something gone (a deleted key); keep every other row.
    rejected = []
    for (entry_id, _), row in zip(entries, rows, strict=True):
        try:
            with transaction.atomic():
                _check_constraints_now()
                UsageRecord.objects.bulk_create([row], ignore_conflicts=True)
        except IntegrityError:
            rejected.append(entry_id)
    return rejected


def _check_constraints_now() -> None:
    """Make PostgreSQL check foreign keys at insert, not at commit (Django defers them), so a
    bad row fails inside its own savepoint and the rest of the batch survives."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def _ensure_group(client) -> None:
    try:
        client.xgroup_create(ledger.stream_key(), ledger.GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def usage_flush(*, consumer: str = "flusher", batch_size: int = USAGE_FLUSH_BATCH) -> int:
    """Move buffered usage events into PostgreSQL; return how many left the buffer.

    Entries this consumer read earlier but could not store (the database was down) are
    retried first; an entry is acknowledged and deleted only after its row is committed.
    One flush runs at a time across all Celery workers; a second call returns 0 at once.
    """
    client = sync_redis()
    lock = client.lock(rkey("usage", "flush-lock"), timeout=USAGE_FLUSH_LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        return 0
    try:
        return _usage_flush_rounds(client, consumer=consumer, batch_size=batch_size)
    finally:
        lock.release()


def _usage_flush_rounds(client, *, consumer: str, batch_size: int) -> int:
    _ensure_group(client)
    stored = 0
    for _ in range(USAGE_FLUSH_MAX_ROUNDS):
        # "0" re-reads this consumer's unacknowledged entries; ">" takes new ones.
        response = client.xreadgroup(
            ledger.GROUP, consumer, {ledger.stream_key(): "0"}, count=batch_size
        )
        entries = response[0][1] if response else []
        if not entries:
            response = client.xreadgroup(
                ledger.GROUP, consumer, {ledger.stream_key(): ">"}, count=batch_size
            )
            entries = response[0][1] if response else []
        if not entries:
            break
        decoded = []
        dead: list[tuple[bytes, bytes]] = []
        for entry_id, fields in entries:
            raw = fields.get(ledger.FIELD)
            try:
                decoded.append((entry_id, ledger.UsageEvent.decode(raw)))
            except (TypeError, ValueError):
                dead.append((entry_id, raw or b""))
        try:
            rejected = set(_usage_insert(decoded))
        except DatabaseError:
            logger.warning("usage flush: database unavailable; %d events wait", len(entries))
            break
        dead.extend((entry_id, e.encode()) for entry_id, e in decoded if entry_id in rejected)
        ids = [entry_id for entry_id, _ in entries]
        pipe = client.pipeline(transaction=True)
        for entry_id, raw in dead:
            pipe.xadd(ledger.dead_letter_key(), {ledger.FIELD: raw, b"id": entry_id})
        pipe.xack(ledger.stream_key(), ledger.GROUP, *ids)
        pipe.xdel(ledger.stream_key(), *ids)
        pipe.execute()
        if dead:
            logger.error("usage flush: %d events moved to the dead-letter stream", len(dead))
        stored += len(entries) - len(dead)
        if len(entries) < batch_size:
            break
    return stored
