"""Writes for hardware profiles and nodes: tokens, registration, heartbeats, staleness, drains.

Live node state is Redis's (apps.hardware.nodestate): gateways route on it and heartbeats write
only there, so nodes stay routable while PostgreSQL is down and a heartbeat costs the process
that serves it no database write. The Node rows are its durable mirror, caught up in one
transaction by the periodic nodes_sync; only an operator's drain goes the other way, from the
row to the live state.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import orjson
import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.hardware.broadcast import node_update_broadcast
from apps.hardware.choices import NodeStatus
from apps.hardware.errors import HardwareErrorCode
from apps.hardware.models import HardwareProfile, Node, NodeToken
from apps.hardware.nodestate import (
    NodeSnapshot,
    TokenRecord,
    fleet_key,
    fleet_resources_key,
    node_token_key,
    now,
)
from apps.hardware.profiles import ProfilesLoaded, profiles_sync
from apps.hardware.resources import summarize, view_profile
from apps.models.services import model_version_attach_tokenizer, model_version_find
from dmxplatform import credentials
from dmxplatform.errors import AuthenticationError, NotFoundError
from dmxplatform.redis_client import sync_redis
from inference.hardware.profiles import PROFILES_DIR, load_profiles
from inference.wire import EngineLoad, Heartbeat, Registration

NODE_TOKEN_PREFIX = "dmx-node-"


@transaction.atomic
def hardware_profiles_load(*, directory: Path = PROFILES_DIR) -> ProfilesLoaded:
    """Load the profile files into the database; operators' prices are kept. Idempotent."""
    return profiles_sync(model=HardwareProfile, profiles=load_profiles(directory))


def hardware_profile_update(*, profile: HardwareProfile, price_changed: bool) -> HardwareProfile:
    """Save an operator's edit; a changed price is marked theirs, so loads keep it."""
    if price_changed:
        profile.price_overridden = True
    profile.full_clean()
    profile.save()
    return profile


def _token_record(token: NodeToken) -> TokenRecord:
    return TokenRecord(
        id=token.id,
        token_id=token.token_id,
        secret_hash=token.secret_hash,
        revoked=token.revoked_at is not None,
    )


def node_token_publish(token: NodeToken) -> None:
    """Mirror a token into Redis after commit (creation, revocation)."""
    record = _token_record(token)
    transaction.on_commit(lambda: sync_redis().set(node_token_key(token.token_id), record.encode()))


def node_token_create(*, name: str) -> tuple[NodeToken, str]:
    """Create a node token; return it and the plaintext, which is shown once."""
    issued = credentials.issue(NODE_TOKEN_PREFIX)
    token = NodeToken(name=name, token_id=issued.credential_id, secret_hash=issued.secret_hash)
    token.full_clean()
    token.save()
    node_token_publish(token)
    return token, issued.plaintext


def node_token_update(*, token: NodeToken) -> NodeToken:
    token.full_clean()
    token.save()
    node_token_publish(token)
    return token


def _token_from_database(token_id: str) -> TokenRecord | None:
    """Load a token Redis does not hold and put it back there."""
    token = NodeToken.objects.filter(token_id=token_id).first()
    if token is None:
        return None
    record = _token_record(token)
    sync_redis().set(node_token_key(token_id), record.encode())
    return record


def _token_verified(parts: tuple[str, str] | None, record: TokenRecord | None) -> TokenRecord:
    if (
        parts is None
        or record is None
        or record.revoked
        or not credentials.secret_matches(parts[1], record.secret_hash)
    ):
        raise AuthenticationError("Invalid node token.", code=HardwareErrorCode.INVALID_NODE_TOKEN)
    return record


def node_token_authenticate(*, plaintext: str) -> TokenRecord:
    """Return the live token a worker presented, or raise AuthenticationError."""
    parts = credentials.split(plaintext, NODE_TOKEN_PREFIX)
    record = None
    if parts is not None:
        raw = sync_redis().get(node_token_key(parts[0]))
        record = TokenRecord.decode(raw) if raw is not None else _token_from_database(parts[0])
    return _token_verified(parts, record)


async def node_token_authenticate_async(*, redis: aioredis.Redis, plaintext: str) -> TokenRecord:
    """node_token_authenticate on an event loop: Redis answers; the database only on a miss."""
    parts = credentials.split(plaintext, NODE_TOKEN_PREFIX)
    record = None
    if parts is not None:
        raw = await redis.get(node_token_key(parts[0]))
        record = (
            TokenRecord.decode(raw)
            if raw is not None
            else await database_sync_to_async(_token_from_database)(parts[0])
        )
    return _token_verified(parts, record)


def node_snapshot(node: Node) -> NodeSnapshot:
    """Return the state gateways route on, from a node row."""
    version = node.model_version
    return NodeSnapshot(
        id=node.id,
        name=node.name,
        url=node.url,
        status=node.status,
        drained=node.drained,
        model=version.model.name,
        version_id=version.id,
        version_tag=version.tag,
        served_model_name=node.served_model_name,
        max_model_len=node.max_model_len,
        heartbeat_at=node.last_heartbeat_at.timestamp(),
        token_id=node.token_id,
        engine=EngineLoad(
            num_requests_running=node.num_requests_running,
            num_requests_waiting=node.num_requests_waiting,
            kv_cache_usage=node.kv_cache_usage,
        ),
        profile=node.profile.name if node.profile_id else None,
        priority_scheduling=node.engine_args.get("scheduling_policy") == "priority",
        max_num_seqs=int(node.engine_args.get("max_num_seqs") or 0),
        **summarize(
            node.resources,
            unit_price_usd=float(node.profile.hourly_price_usd) if node.profile_id else None,
        ),
    )


def fleet_publish(*nodes: Node) -> None:
    """Mirror nodes into the Redis hash gateways read, after the transaction commits."""
    if not nodes:
        return
    mapping = {str(node.id): node_snapshot(node).encode() for node in nodes}
    transaction.on_commit(lambda: sync_redis().hset(fleet_key(), mapping=mapping))


@transaction.atomic
def node_register(*, token: TokenRecord, registration: Registration) -> tuple[Node, bool]:
    """Create or refresh the node a worker announces; say whether its tokenizer is wanted."""
    version = model_version_find(model_name=registration.model, tag=registration.version)
    tokenizer_wanted = False
    if registration.tokenizer_sha256:
        tokenizer_wanted = not model_version_attach_tokenizer(
            version=version, sha256=registration.tokenizer_sha256
        )
    moment = timezone.now()
    # The profile the worker matched, with the database's (possibly overridden) price; a GPU
    # no profile describes keeps whatever profile an operator gave its node.
    profile_name = view_profile(registration.resources)
    profile = HardwareProfile.objects.filter(name=profile_name).first() if profile_name else None
    node, _ = Node.objects.select_for_update(of=("self",)).update_or_create(
        name=registration.name,
        defaults={
            **({"profile": profile} if profile else {}),
            "url": registration.url.rstrip("/"),
            "status": NodeStatus.UP,
            "model_version": version,
            "served_model_name": registration.served_model_name,
            "max_model_len": registration.max_model_len,
            "token_id": token.id,
            "registered_at": moment,
            "last_heartbeat_at": moment,
            "num_requests_running": 0,
            "num_requests_waiting": 0,
            "kv_cache_usage": 0.0,
            "resources": registration.resources,
            "engine_args": registration.engine_args,
        },
    )
    fleet_publish(node)
    return node, tokenizer_wanted


def _snapshot_from_database(node_id: int) -> NodeSnapshot | None:
    node = Node.objects.select_related("model_version__model", "profile").filter(id=node_id).first()
    return node_snapshot(node) if node else None


def _heartbeat_applied(snapshot: NodeSnapshot, heartbeat: Heartbeat) -> NodeSnapshot:
    # Registration priced the node from its database profile; heartbeats keep that unit price.
    unit_price = (
        snapshot.hourly_price_usd / max(snapshot.gpu_count, 1) if snapshot.profile else None
    )
    return dataclasses.replace(
        snapshot,
        status=heartbeat.status,
        heartbeat_at=now(),
        engine=heartbeat.engine,
        **summarize(heartbeat.resources, unit_price_usd=unit_price),
    )


async def node_heartbeat_record(
    *, redis: aioredis.Redis, token: TokenRecord, node_id: int, heartbeat: Heartbeat
) -> NodeSnapshot:
    """Store a heartbeat in the live state gateways route on (nodes_sync copies it into the
    Node row); the database is read only when Redis has lost the node."""
    raw = await redis.hget(fleet_key(), str(node_id))
    snapshot = (
        NodeSnapshot.decode(raw)
        if raw is not None
        else await database_sync_to_async(_snapshot_from_database)(node_id)
    )
    if snapshot is None or snapshot.token_id != token.id:
        raise NotFoundError(
            f"Node {node_id} is not registered with this token.",
            code=HardwareErrorCode.NODE_NOT_FOUND,
        )
    snapshot = _heartbeat_applied(snapshot, heartbeat)
    pipe = redis.pipeline(transaction=False)
    pipe.hset(fleet_key(), str(node_id), snapshot.encode())
    if heartbeat.resources:
        pipe.hset(fleet_resources_key(), str(node_id), orjson.dumps(heartbeat.resources))
    await pipe.execute()
    node_update_broadcast(snapshot)  # to the fleet dashboard, without waiting
    return snapshot


def _drained_set(node: Node, drained: bool) -> Node:
    node.drained = drained
    node.save(update_fields=["drained"])

    def publish() -> None:
        # Onto the live snapshot rather than one made from the row, whose load figures lag
        # the heartbeats. A node Redis has lost gets the flag back from its row with its next
        # heartbeat; a heartbeat that read the snapshot before this write and stores it after
        # undoes it until the next nodes_sync, which puts the row's flag back.
        client = sync_redis()
        raw = client.hget(fleet_key(), str(node.id))
        if raw is not None:
            snapshot = dataclasses.replace(NodeSnapshot.decode(raw), drained=drained)
            client.hset(fleet_key(), str(node.id), snapshot.encode())

    transaction.on_commit(publish)
    return node


def node_drain(*, node: Node) -> Node:
    """Cordon a node: gateways send it no new requests while its in-flight ones finish. It stays
    drained across heartbeats and re-registrations, until node_undrain."""
    return _drained_set(node, True)


def node_undrain(*, node: Node) -> Node:
    """Let gateways route new requests to a drained node again."""
    return _drained_set(node, False)


def nodes_sync() -> int:
    """Mark down the nodes whose heartbeats stopped, put operators' drains back where a
    heartbeat lost them, and copy the live state into the Node rows in one transaction; return
    how many nodes were marked down.

    Heartbeats write Redis only: a database write each would cost the processes that serve
    /v1 a thread hop and a commit per node every few seconds. This periodic task is the one
    writer of the rows' live columns, and it judges staleness on Redis, where heartbeats land.
    """
    client = sync_redis()
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(fleet_key())
    pipe.hgetall(fleet_resources_key())
    nodes, resources = pipe.execute()
    cutoff = now() - settings.DMX_NODE_STALE_SECONDS
    live = {s.id: s for s in map(NodeSnapshot.decode, nodes.values())}
    stale = [
        dataclasses.replace(s, status=NodeStatus.DOWN)
        for s in live.values()
        if s.status != NodeStatus.DOWN and s.heartbeat_at < cutoff
    ]
    if stale:
        client.hset(fleet_key(), mapping={str(s.id): s.encode() for s in stale})
        live.update((s.id, s) for s in stale)
    rows = list(
        Node.objects.filter(id__in=live).values_list("id", "last_heartbeat_at", "status", "drained")
    )
    # The drain is the row's: a snapshot that lost it to a heartbeat racing node_drain's
    # publish gets it back here.
    undone = [
        dataclasses.replace(live[node_id], drained=drained)
        for node_id, _, _, drained in rows
        if live[node_id].drained != drained
    ]
    if undone:
        client.hset(fleet_key(), mapping={str(s.id): s.encode() for s in undone})
        live.update((s.id, s) for s in undone)
    with transaction.atomic():
        for node_id, row_heartbeat_at, row_status, _ in rows:
            snapshot = live[node_id]
            heartbeat_at = datetime.fromtimestamp(snapshot.heartbeat_at, tz=UTC)
            if (row_heartbeat_at, row_status) == (heartbeat_at, snapshot.status):
                continue
            fields = {
                "status": snapshot.status,
                "last_heartbeat_at": heartbeat_at,
                "num_requests_running": snapshot.engine.num_requests_running,
                "num_requests_waiting": snapshot.engine.num_requests_waiting,
                "kv_cache_usage": snapshot.engine.kv_cache_usage,
            }
            view = resources.get(str(node_id).encode())
            if view is not None:
                fields["resources"] = orjson.loads(view)
            # A registration committing during this sync may be set back here; the next sync
            # copies its newer live state over it.
            Node.objects.filter(id=node_id).update(**fields)
    return len(stale)
