"""Writes for nodes: tokens, registration, heartbeats, staleness; each is mirrored to Redis."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.hardware.choices import NodeStatus
from apps.hardware.errors import HardwareErrorCode
from apps.hardware.fleet import NodeSnapshot, fleet_key
from apps.hardware.models import Node, NodeToken
from apps.models.services import model_version_attach_tokenizer, model_version_find
from dmxplatform import credentials
from dmxplatform.errors import AuthenticationError, NotFoundError
from dmxplatform.redis_client import sync_redis
from inference.wire import Heartbeat, Registration

NODE_TOKEN_PREFIX = "dmx-node-"


def node_token_create(*, name: str) -> tuple[NodeToken, str]:
    """Create a node token; return it and the plaintext, which is shown once."""
    issued = credentials.issue(NODE_TOKEN_PREFIX)
    token = NodeToken(name=name, token_id=issued.credential_id, secret_hash=issued.secret_hash)
    token.full_clean()
    token.save()
    return token, issued.plaintext


def node_token_authenticate(*, plaintext: str) -> NodeToken:
    """Return the live token a worker presented, or raise AuthenticationError."""
    parts = credentials.split(plaintext, NODE_TOKEN_PREFIX)
    token = None
    if parts:
        token = NodeToken.objects.filter(token_id=parts[0], revoked_at__isnull=True).first()
    if token is None or not credentials.secret_matches(parts[1], token.secret_hash):
        raise AuthenticationError("Invalid node token.", code=HardwareErrorCode.INVALID_NODE_TOKEN)
    return token


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
        num_requests_running=node.num_requests_running,
        num_requests_waiting=node.num_requests_waiting,
        kv_cache_usage=node.kv_cache_usage,
        profile=node.profile.name if node.profile_id else None,
    )


def fleet_publish(*nodes: Node) -> None:
    """Mirror nodes into the Redis hash gateways read, after the transaction commits."""
    if not nodes:
        return
    mapping = {str(node.id): node_snapshot(node).encode() for node in nodes}
    transaction.on_commit(lambda: sync_redis().hset(fleet_key(), mapping=mapping))


@transaction.atomic
def node_register(*, token: NodeToken, registration: Registration) -> tuple[Node, bool]:
    """Create or refresh the node a worker announces; say whether its tokenizer is wanted."""
    version = model_version_find(model_name=registration.model, tag=registration.version)
    tokenizer_wanted = False
    if registration.tokenizer_sha256:
        tokenizer_wanted = not model_version_attach_tokenizer(
            version=version, sha256=registration.tokenizer_sha256
        )
    now = timezone.now()
    node, _ = Node.objects.select_for_update(of=("self",)).update_or_create(
        name=registration.name,
        defaults={
            "url": registration.url.rstrip("/"),
            "status": NodeStatus.UP,
            "model_version": version,
            "served_model_name": registration.served_model_name,
            "max_model_len": registration.max_model_len,
            "token": token,
            "registered_at": now,
            "last_heartbeat_at": now,
            "num_requests_running": 0,
            "num_requests_waiting": 0,
            "kv_cache_usage": 0.0,
            "resources": registration.resources,
            "engine_args": registration.engine_args,
        },
    )
    fleet_publish(node)
    return node, tokenizer_wanted


@transaction.atomic
def node_heartbeat_record(*, token: NodeToken, node_id: int, heartbeat: Heartbeat) -> Node:
    """Store a heartbeat's load and status; a node only reports for itself."""
    node = (
        Node.objects.select_for_update(of=("self",))
        .select_related("model_version__model", "profile")
        .filter(id=node_id, token=token)
        .first()
    )
    if node is None:
        raise NotFoundError(
            f"Node {node_id} is not registered with this token.",
            code=HardwareErrorCode.NODE_NOT_FOUND,
        )
    engine = heartbeat.engine
    node.status = heartbeat.status
    node.last_heartbeat_at = timezone.now()
    node.num_requests_running = engine.num_requests_running
    node.num_requests_waiting = engine.num_requests_waiting
    node.kv_cache_usage = engine.kv_cache_usage
    if heartbeat.resources:
        node.resources = heartbeat.resources
    node.save(
        update_fields=[
            "status",
            "last_heartbeat_at",
            "num_requests_running",
            "num_requests_waiting",
            "kv_cache_usage",
            "resources",
        ]
    )
    fleet_publish(node)
    return node


@transaction.atomic
def nodes_mark_stale() -> int:
    """Mark nodes down whose heartbeats stopped; return how many changed."""
    cutoff = timezone.now() - timedelta(seconds=settings.DMX_NODE_STALE_SECONDS)
    stale = list(
        Node.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("model_version__model", "profile")
        .filter(status__in=[NodeStatus.UP, NodeStatus.DRAINING], last_heartbeat_at__lt=cutoff)
    )
    for node in stale:
        node.status = NodeStatus.DOWN
    Node.objects.bulk_update(stale, ["status"])
    fleet_publish(*stale)
    return len(stale)
