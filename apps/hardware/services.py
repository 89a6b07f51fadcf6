"""Writes for hardware profiles and nodes: tokens, registration, heartbeats, staleness.

Live node state is Redis's (apps.hardware.fleet): gateways route on it and a heartbeat lands
there first, so nodes stay routable while PostgreSQL is down. The Node rows are its durable
mirror, written in the same call when the database answers and caught up by the next
heartbeat when it does not.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from apps.hardware.choices import NodeStatus
from apps.hardware.errors import HardwareErrorCode
from apps.hardware.fleet import (
    NodeSnapshot,
    TokenRecord,
    engine_fields,
    fleet_key,
    node_token_key,
    now,
)
from apps.hardware.models import HardwareProfile, Node, NodeToken
from apps.hardware.profiles import ProfilesLoaded, profiles_sync
from apps.hardware.resources import summarize, view_profile
from apps.models.services import model_version_attach_tokenizer, model_version_find
from dmxplatform import credentials
from dmxplatform.errors import AuthenticationError, NotFoundError
from dmxplatform.redis_client import sync_redis
from inference.hardware.profiles import PROFILES_DIR, load_profiles
from inference.wire import Heartbeat, Registration

logger = logging.getLogger(__name__)

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


def _token_lookup(token_id: str) -> TokenRecord | None:
    raw = sync_redis().get(node_token_key(token_id))
    if raw is not None:
        return TokenRecord.decode(raw)
    token = NodeToken.objects.filter(token_id=token_id).first()
    if token is None:
        return None
    record = _token_record(token)
    sync_redis().set(node_token_key(token_id), record.encode())
    return record


def node_token_authenticate(*, plaintext: str) -> TokenRecord:
    """Return the live token a worker presented, or raise AuthenticationError."""
    parts = credentials.split(plaintext, NODE_TOKEN_PREFIX)
    record = _token_lookup(parts[0]) if parts else None
    if (
        record is None
        or record.revoked
        or not credentials.secret_matches(parts[1], record.secret_hash)
    ):
        raise AuthenticationError("Invalid node token.", code=HardwareErrorCode.INVALID_NODE_TOKEN)
    return record


def node_snapshot(node: Node) -> NodeSnapshot:
    """Return the state gateways route on, from a node row."""
    version = node.model_version
    return NodeSnapshot(
        id=node.id,
        name=node.name,
        url=node.url,
        status=node.status,
        model=version.model.name,
        version_id=version.id,
        version_tag=version.tag,
        served_model_name=node.served_model_name,
        max_model_len=node.max_model_len,
        heartbeat_at=node.last_heartbeat_at.timestamp(),
        token_id=node.token_id,
        num_requests_running=node.num_requests_running,
        num_requests_waiting=node.num_requests_waiting,
        kv_cache_usage=node.kv_cache_usage,
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


def _snapshot_of(node_id: int) -> NodeSnapshot | None:
    raw = sync_redis().hget(fleet_key(), str(node_id))
    if raw is not None:
        return NodeSnapshot.decode(raw)
    node = Node.objects.select_related("model_version__model", "profile").filter(id=node_id).first()
    return node_snapshot(node) if node else None


def node_heartbeat_record(
    *, token: TokenRecord, node_id: int, heartbeat: Heartbeat
) -> NodeSnapshot:
    """Store a heartbeat: in Redis at once, in the database when it answers."""
    snapshot = _snapshot_of(node_id)
    if snapshot is None or snapshot.token_id != token.id:
        raise NotFoundError(
            f"Node {node_id} is not registered with this token.",
            code=HardwareErrorCode.NODE_NOT_FOUND,
        )
    engine = heartbeat.engine
    # Registration priced the node from its database profile; heartbeats keep that unit price.
    unit_price = (
        snapshot.hourly_price_usd / max(snapshot.gpu_count, 1) if snapshot.profile else None
    )
    snapshot = dataclasses.replace(
        snapshot,
        status=heartbeat.status,
        heartbeat_at=now(),
        **engine_fields(engine),
        **summarize(heartbeat.resources, unit_price_usd=unit_price),
    )
    sync_redis().hset(fleet_key(), str(node_id), snapshot.encode())
    fields = {
        "status": snapshot.status,
        "last_heartbeat_at": timezone.now(),
        "num_requests_running": engine.num_requests_running,
        "num_requests_waiting": engine.num_requests_waiting,
        "kv_cache_usage": engine.kv_cache_usage,
    }
    if heartbeat.resources:
        fields["resources"] = heartbeat.resources
    try:
        Node.objects.filter(id=node_id).update(**fields)
    except DatabaseError as exc:
        logger.warning("heartbeat of node %s kept in Redis only: %s", node_id, exc)
    return snapshot


def nodes_mark_stale() -> int:
    """Mark down the nodes whose heartbeats stopped; return how many changed.

    Staleness is judged on the live state in Redis, where heartbeats land first.
    """
    client = sync_redis()
    cutoff = now() - settings.DMX_NODE_STALE_SECONDS
    stale = []
    for raw in client.hgetall(fleet_key()).values():
        snapshot = NodeSnapshot.decode(raw)
        if snapshot.status != NodeStatus.DOWN and snapshot.heartbeat_at < cutoff:
            stale.append(dataclasses.replace(snapshot, status=NodeStatus.DOWN))
    if stale:
        client.hset(fleet_key(), mapping={str(s.id): s.encode() for s in stale})
        Node.objects.filter(id__in=[s.id for s in stale]).update(status=NodeStatus.DOWN)
    return len(stale)
