"""POST /internal/v1/nodes/{id}/heartbeat as plain ASGI, served by the gateway processes.

Every node sends one every DMX_HEARTBEAT_SECONDS to the processes that serve /v1. Through
Django and DRF a heartbeat cost 7 ms of CPU with a CPU node's view and 26 ms with eight GPUs'
(bench/heartbeats.py), in a thread that held the GIL against the event loop: the handler,
content negotiation, a database UPDATE and commit. Here it is a token check and a Redis read
and write on the loop (1.5 ms with eight GPUs), and the Node rows catch up in one transaction
(nodes_sync). Registration and tokenizer uploads, rare, stay DRF views.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.hardware.errors import HardwareErrorCode
from apps.hardware.nodestate import NodeSnapshot
from apps.hardware.services import node_heartbeat_record, node_token_authenticate_async
from dmxplatform import metrics
from dmxplatform.credentials import bearer
from dmxplatform.errors import (
    ApplicationError,
    AuthenticationError,
    InvalidRequestError,
    ServiceUnavailableError,
)
from dmxplatform.redis_client import async_redis
from dmxplatform.responses import (
    Headers,
    dumps,
    header,
    read_body,
    send_error,
    send_json,
    send_method_not_allowed,
)
from inference.wire import Heartbeat, HeartbeatAccepted, WireError

logger = logging.getLogger(__name__)

# A heartbeat is an engine load and a GPU view: 21 KB for eight H100s, so this leaves room
# for the largest nodes and refuses a body no worker sends.
MAX_HEARTBEAT_BYTES = 256 * 1024
# What DRF answers on the node API without credentials, so workers see one contract.
NOT_AUTHENTICATED = "not_authenticated"
CHALLENGE: Headers = [(b"www-authenticate", b'Bearer realm="dmx-nodes"')]


class NodeHeartbeatEndpoint:
    def __init__(self) -> None:
        self._redis: aioredis.Redis | None = None  # made on the serving event loop

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["method"] != "POST":
            await send_method_not_allowed(send, "POST", [])
            return
        try:
            if self._redis is None:
                self._redis = async_redis()
            snapshot = await self._record(scope, receive)
        except ApplicationError as error:
            await self._refuse(send, error)
        except (RedisError, OSError, DatabaseError) as exc:
            logger.warning("heartbeat not stored: %s", exc)
            await self._refuse(
                send, ServiceUnavailableError("The platform cannot store heartbeats right now.")
            )
        except Exception:
            logger.exception("heartbeat failed")
            await self._refuse(
                send, ApplicationError("The server had an error while storing the heartbeat.")
            )
        else:
            metrics.node_heartbeats.labels("200").inc()
            # The drain travels back on the answer: the worker learns it within a heartbeat.
            accepted = HeartbeatAccepted(
                node_id=snapshot.id, status=snapshot.status, drained=snapshot.drained
            )
            body = dumps(accepted.to_dict())
            await send_json(send, 200, body, [])

    @staticmethod
    async def _refuse(send, error: ApplicationError) -> None:
        metrics.node_heartbeats.labels(str(error.status)).inc()
        await send_error(send, error, CHALLENGE if isinstance(error, AuthenticationError) else [])

    async def _record(self, scope: dict[str, Any], receive) -> NodeSnapshot:
        credential = bearer(header(scope, b"authorization"))
        if credential is None:
            raise AuthenticationError(
                "A node token is required: Authorization: Bearer dmx-node-…",
                code=NOT_AUTHENTICATED,
            )
        token = await node_token_authenticate_async(redis=self._redis, plaintext=credential)
        body = await read_body(receive, MAX_HEARTBEAT_BYTES)
        try:
            heartbeat = Heartbeat.from_json(body)
        except WireError as exc:
            raise InvalidRequestError(
                exc.message, param=exc.field, code=HardwareErrorCode.INVALID_PAYLOAD
            ) from exc
        return await node_heartbeat_record(
            redis=self._redis,
            token=token,
            node_id=scope["url_route"]["kwargs"]["node_id"],
            heartbeat=heartbeat,
        )
