"""The playground's WebSocket (/ws/playground): a signed-in user chats with a model through one
of their tenant's keys, the answer streamed back token by token.

The completion runs through apps.gateway.direct.chat_stream, the very pipeline /v1 runs, so the
key's limits, the content filter and billing to the key apply as they do to an API call.

The browser sends {"type": "chat", "key_id", "model", "messages", "temperature", "max_tokens"};
the consumer answers {"type": "delta", "content"} per chunk, then {"type": "done", "request_id",
"usage", "ttft_ms", "finish_reason"}, or {"type": "error", "error": {...}} in the platform's
shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.gateway.direct import chat_stream
from apps.gateway.errors import GatewayErrorCode
from apps.keys.gate import KeyRecord
from apps.keys.selectors import key_record_load, memberships_of
from dmxplatform.errors import (
    ApplicationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)

logger = logging.getLogger(__name__)

# What of a chat message goes on to the pipeline, which validates it as it validates /v1.
CHAT_FIELDS = ("model", "messages", "temperature", "max_tokens")


def _member_key(user, key_id: str) -> KeyRecord | None:
    """The key `key_id` when it belongs to a tenant `user` is a member of; else None, so that a
    key of another tenant and one that does not exist look the same."""
    record = key_record_load(key_id)
    if record is None or not memberships_of(user=user).filter(tenant_id=record.tenant_id).exists():
        return None
    return record


class PlaygroundConsumer(AsyncJsonWebsocketConsumer):
    # Nothing is ever sent to a playground socket through the channel layer; without this every
    # connection would hold a Redis listener of its own.
    channel_layer_alias = None
    # The answer being streamed, at most one per socket.
    generation: asyncio.Task | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # before accept: the handshake is refused with 403
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        # The browser left: leaving chat_stream's iteration stops the generation, and the
        # pipeline bills what was generated.
        if self.generation is not None and not self.generation.done():
            self.generation.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.generation

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Decode one message; a frame that is not a JSON object gets an error, not a crash."""
        try:
            content = orjson.loads(text_data if text_data is not None else bytes_data or b"")
        except orjson.JSONDecodeError:
            content = None
        if not isinstance(content, dict):
            await self._send_error(
                InvalidRequestError(
                    "Send each message as one JSON object.", code=GatewayErrorCode.INVALID_JSON
                )
            )
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs) -> None:
        if content.get("type") != "chat":
            await self._send_error(
                InvalidRequestError(
                    'The message type must be "chat".',
                    param="type",
                    code=GatewayErrorCode.INVALID_VALUE,
                )
            )
            return
        if self.generation is not None and not self.generation.done():
            await self._send_error(ConflictError("Wait for the answer in progress to finish."))
            return
        key_id = content.get("key_id")
        key = None
        if isinstance(key_id, str):
            key = await database_sync_to_async(_member_key)(self.scope["user"], key_id)
        if key is None:
            await self._send_error(
                NotFoundError(
                    "No such API key in your tenants.",
                    param="key_id",
                    code=GatewayErrorCode.NOT_FOUND,
                )
            )
            return
        body = {name: content[name] for name in CHAT_FIELDS if name in content}
        # A task of its own: the consumer keeps reading the socket meanwhile, so that it sees
        # the browser leave and can stop the generation.
        self.generation = asyncio.ensure_future(self._answer(key, body))

    async def _answer(self, key: KeyRecord, body: dict[str, Any]) -> None:
        started = time.perf_counter()
        ttft_ms: float | None = None
        usage: dict[str, Any] | None = None
        finish_reason: str | None = None
        try:
            async for reply, chunk in chat_stream(key=key, body=body, caller=self.scope):
                if reply.status != 200:  # refused before the first token, as /v1 would
                    await self.send_json({"type": "error", "error": reply.error})
                    return
                if chunk is None:
                    continue
                if "error" in chunk:  # the pipeline failed after the first token
                    await self.send_json({"type": "error", "error": chunk["error"]})
                    return
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    finish_reason = choice.get("finish_reason") or finish_reason
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if ttft_ms is None:
                            ttft_ms = round((time.perf_counter() - started) * 1000, 1)
                        await self.send_json({"type": "delta", "content": text})
            await self.send_json(
                {
                    "type": "done",
                    "request_id": reply.request_id,
                    "usage": usage,
                    "ttft_ms": ttft_ms,
                    "finish_reason": finish_reason,
                }
            )
        except OSError:
            pass  # the browser left while we sent; disconnect() stops the generation
        except Exception:  # a bug: the browser hears of it, the socket stays usable
            logger.exception("playground answer failed")
            await self._send_error(
                ApplicationError("The server had an error while processing your request.")
            )

    async def _send_error(self, error: ApplicationError) -> None:
        await self.send_json({"type": "error", **error.to_dict()})

    @classmethod
    async def encode_json(cls, content: dict[str, Any]) -> str:
        return orjson.dumps(content).decode()
