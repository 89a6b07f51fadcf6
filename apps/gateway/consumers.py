"""The OpenAI-compatible endpoints, as ASGI applications routed by Channels (config.asgi).

Plain ASGI rather than Channels' AsyncHttpConsumer: that class hops to a thread on every
message (close_old_connections) and cannot see a client disconnect while it streams, and the
hot path needs neither the hop nor the blindness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from apps.gateway.dialects import dialect_for
from apps.gateway.direct import stream
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.pipeline import MAX_BODY_BYTES, complete, count_tokens
from apps.gateway.reply import ClientReply
from apps.gateway.runtime import get_runtime, shutdown_runtime
from apps.gateway.schemas import Endpoint
from apps.gateway.state import CompletionState, new_request_id, request_id_headers
from apps.gateway.stored import input_item_page, not_found, query_int
from apps.keys.errors import KeysErrorCode
from apps.models.catalog import ModelEntry
from apps.models.errors import ModelsErrorCode
from dmxplatform.clients import client_address
from dmxplatform.errors import (
    ApplicationError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    ServiceUnavailableError,
)
from dmxplatform.resp import RedisUnavailable, RespError
from dmxplatform.responses import (
    dumps,
    header,
    method_not_allowed,
    query_params,
    read_body,
    send_error,
    send_json,
    wait_disconnect,
)

logger = logging.getLogger(__name__)
# RFC 6455's close code for a connection refused by policy (here: no valid key).
WS_POLICY_VIOLATION = 1008


class TokenCountEndpoint:
    """POST /v1/messages/count_tokens and /v1/responses/input_tokens: token counting in
    Anthropic's and OpenAI's APIs (apps.gateway.pipeline)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["method"] != "POST":
            await _refuse_method(send, "POST", self.endpoint)
            return
        if self.endpoint is Endpoint.MESSAGES:
            scope = _api_key_as_bearer(scope)
        await count_tokens(CompletionState(self.endpoint, scope, receive, send))


class CompletionsEndpoint:
    """POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and
    /v1/embeddings: each through the one pipeline, in its own API (apps.gateway.dialects)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["method"] != "POST":
            await _refuse_method(send, "POST", self.endpoint)
            return
        if self.endpoint is Endpoint.MESSAGES:
            scope = _api_key_as_bearer(scope)
        await complete(CompletionState(self.endpoint, scope, receive, send))


class StoredResponseEndpoint:
    """Stored responses: a response, its input items, its deletion and a background run's
    cancellation (apps.gateway.stored), for any key of the tenant that made it. GET and DELETE
    /v1/responses/{id} (GET ?stream=true&starting_after=N streams a background run's events
    from there), GET .../input_items, POST .../cancel."""

    def __init__(self, action: str = "") -> None:
        self.action = action
        self.allowed = {"": "GET, DELETE", "input_items": "GET", "cancel": "POST"}[action]

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        headers = [(b"x-request-id", new_request_id().encode())]
        if scope["method"] not in self.allowed.split(", "):
            await _refuse_method(send, self.allowed)
            return
        try:
            runtime = await get_runtime()
            # As /v1 authenticates: the key's allowed networks, and a signing key's signature.
            key, _ = await runtime.gate.authenticate(
                scope,
                await read_body(receive, MAX_QUERY_BODY_BYTES),
                address=client_address(scope, runtime.trusted_proxies),
            )
            response_id = scope["url_route"]["kwargs"]["response_id"]
            query = query_params(scope)
            record = await runtime.responses.get(response_id, key.tenant_id)
            if record is None:
                raise not_found(response_id)
            if scope["method"] == "DELETE":
                await runtime.responses.delete(record)
                body = {"id": response_id, "object": "response", "deleted": True}
            elif self.action == "input_items":
                body = input_item_page(record, query)
            elif self.action == "cancel":
                body = await runtime.responses.cancel(record)
            elif _flag(query, "stream"):
                await _stream_events(runtime.responses, record, query, receive, send, headers)
                return
            else:
                body = record.response
            await send_json(send, 200, dumps(body), headers)
        except ApplicationError as error:
            await send_error(send, error, headers)


# These calls carry no body worth the name (a signed call signs an empty one).
MAX_QUERY_BODY_BYTES = 64 * 1024


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


async def _stream_events(store, record, query, receive, send, headers) -> None:
    """A background run's events after `starting_after`, as server-sent events, to its end or
    until the client leaves."""
    if not record.background:
        raise InvalidRequestError(
            "Only responses created with 'background': true can be streamed.",
            param="stream",
            code=GatewayErrorCode.RESPONSE_NOT_STREAMABLE,
        )
    after = query_int(query, "starting_after", -1)
    reply = ClientReply(send, headers, lambda error: error.to_json())

    async def relay() -> None:
        poll = settings.DMX_BACKGROUND_CANCEL_POLL_SECONDS
        async for event in store.events(record, after=after, poll=poll):
            await reply.body(event, more=True)

    relaying = asyncio.ensure_future(relay())
    leaving = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait((relaying, leaving), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relaying, leaving):
            task.cancel()
    if leaving.done() and not leaving.cancelled():
        return  # the client left: nothing more to send
    try:
        relaying.result()
    except ApplicationError as error:
        if not reply.started:
            raise
        logger.warning("stream of %s ended by %r", record.id, error)
    except (RedisUnavailable, RespError) as exc:
        if not reply.started:
            raise ServiceUnavailableError(
                "The response's events cannot be read now. Please retry shortly.",
                code=GatewayErrorCode.STATE_UNAVAILABLE,
            ) from exc
        logger.warning("stream of %s ended by %r", record.id, exc)
    await reply.body(b"", more=False)


def _api_key_as_bearer(scope: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's clients send the key as `x-api-key`: read it as the bearer token it is,
    where no Authorization header came."""
    api_key = header(scope, b"x-api-key")
    if api_key is None or header(scope, b"authorization") is not None:
        return scope
    return {**scope, "headers": [*scope["headers"], (b"authorization", b"Bearer " + api_key)]}


class ModelsEndpoint:
    """GET /v1/models and GET /v1/models/{model}: models the key may use that a live node serves."""

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        headers = [(b"x-request-id", new_request_id().encode())]
        if scope["method"] != "GET":
            await _refuse_method(send, "GET")
            return
        try:
            runtime = await get_runtime()
            key = await runtime.gate.key(header(scope, b"authorization"))
            models = [
                _model_object(m) for m in runtime.dispatcher.served_models() if key.allows(m.name)
            ]
            wanted = scope["url_route"]["kwargs"].get("model")
            if wanted is None:
                await send_json(send, 200, dumps({"object": "list", "data": models}), headers)
                return
            found = next((m for m in models if m["id"] == wanted), None)
            if found is None:
                raise NotFoundError(
                    f"The model `{wanted}` does not exist or you do not have access to it.",
                    param="model",
                    code=ModelsErrorCode.MODEL_NOT_FOUND,
                )
            await send_json(send, 200, dumps(found), headers)
        except ApplicationError as error:
            await send_error(send, error, headers)


def _model_object(model: ModelEntry) -> dict[str, Any]:
    """OpenAI's model object, with what a client must know to call it: its kind (`generate`
    or `embed`) and its context length (`max_model_len`, as vLLM's /v1/models says it)."""
    return {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": model.owned_by,
        "kind": model.kind,
        "max_model_len": model.max_context_tokens,
    }


class LivenessEndpoint:
    """GET /livez: the process answers (its event loop runs); nothing else is asked, so a
    restart is never ordered for an outage elsewhere."""

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["method"] != "GET":
            await _refuse_method(send, "GET")
            return
        await send_json(send, 200, dumps({"status": "ok"}), [])


class ReadinessEndpoint:
    """GET /readyz: the process can serve (GatewayRuntime.readiness); 503 takes it out of the
    load balancer until it can."""

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["method"] != "GET":
            await _refuse_method(send, "GET")
            return
        try:
            runtime = await get_runtime()
        except Exception as exc:  # it could not start (Redis away at start): not ready
            body = {"status": "unready", "runtime": f"error: {exc.__class__.__name__}"}
            await send_json(send, 503, dumps(body), [])
            return
        state = await runtime.readiness()
        ready = state.pop("ready")
        body = {"status": "ok" if ready else "unready", **state}
        await send_json(send, 200 if ready else 503, dumps(body), [])


class UnknownPathEndpoint:
    """Anything else under /v1: a 404 in the shape of the API whose path it is under
    (Anthropic's below /v1/messages, else OpenAI's), not Django's HTML page."""

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        error = NotFoundError(
            f"Invalid URL ({scope['method']} {scope['path']})", code=GatewayErrorCode.NOT_FOUND
        )
        endpoint = Endpoint.MESSAGES if scope["path"].startswith("/v1/messages/") else None
        await _send_error(send, error, endpoint)


async def _refuse_method(send, allowed: str, endpoint: Endpoint | None = None) -> None:
    await _send_error(send, method_not_allowed(allowed), endpoint)


async def _send_error(send, error: ApplicationError, endpoint: Endpoint | None) -> None:
    """An error answered before any request is read, in `endpoint`'s API (OpenAI's without)."""
    headers = request_id_headers(endpoint, new_request_id())
    body = dialect_for(endpoint).error_body(error) if endpoint is not None else None
    await send_error(send, error, headers, body=body)


class Lifespan:
    """Start the gateway runtime with the server process and stop it with it."""

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await get_runtime()
                except Exception as exc:
                    logger.exception("gateway runtime failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await shutdown_runtime()
                await send({"type": "lifespan.shutdown.complete"})
                return


# The most responses one socket runs at once: OpenAI's SDK runs one per lane (`stream_id`).
SOCKET_MAX_RUNNING = 8
# What a client's `response.create` may carry beside the request body: the event's type, and
# the lane its events are routed to (echoed on each).
_ENVELOPE = ("type", "stream_id")


class ResponsesSocket(AsyncJsonWebsocketConsumer):
    """WebSocket mode of the Responses API (wss://…/v1/responses, OpenAI's and the Open
    Responses specification's): the client sends `response.create` events (a POST body without
    `stream` or `background`), and gets each response's events as messages, tagged with the
    event's `stream_id`; errors come as `{"type": "error", "status", "error"}`. Each response
    runs through the pipeline as a streamed POST /v1/responses authenticated by the handshake's
    key (apps.gateway.direct), so limits, filter, routing, storage and billing are /v1's; a
    client that leaves stops its responses and is billed what they generated."""

    async def connect(self) -> None:
        await self.accept()
        self.running: set[asyncio.Task] = set()
        self.credentials = [
            (name, value)
            for name, value in self.scope["headers"]
            if name in (b"authorization", b"x-client-request-id")
        ]
        try:
            runtime = await get_runtime()
            key, _ = await runtime.gate.authenticate(
                self.scope, b"", address=client_address(self.scope, runtime.trusted_proxies)
            )
            if key.signing_secret_encrypted:
                # Each response would need its own signature, which a socket's events lack.
                raise PermissionDeniedError(
                    "A signing key cannot open a socket: its requests must each be signed; "
                    "use POST /v1/responses.",
                    code=KeysErrorCode.SIGNATURE_REQUIRED,
                )
        except ApplicationError as error:
            await self._error(error)
            await self.close(code=WS_POLICY_VIOLATION)

    async def disconnect(self, code: int) -> None:
        # Leaving a stream's iteration is the client leaving: the pipeline bills what was made.
        for task in list(getattr(self, "running", ())):
            task.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Every frame gets an answer: one that is no JSON object of text (binary, empty,
        malformed, over the API's body limit) an error event, the socket kept."""
        content: Any = None
        if text_data and len(text_data) <= MAX_BODY_BYTES:
            with contextlib.suppress(orjson.JSONDecodeError):
                content = orjson.loads(text_data)
        try:
            if text_data and len(text_data) > MAX_BODY_BYTES:
                raise RequestTooLargeError(f"An event may hold at most {MAX_BODY_BYTES} bytes.")
            body, lane = _socket_request(content)
            if len(self.running) >= SOCKET_MAX_RUNNING:
                raise RateLimitError(
                    f"At most {SOCKET_MAX_RUNNING} responses run at once on one socket.",
                    code=KeysErrorCode.RATE_LIMIT_EXCEEDED,
                )
        except ApplicationError as error:
            await self._error(
                error, content.get("stream_id") if isinstance(content, dict) else None
            )
            return
        task = asyncio.ensure_future(self._respond(body, lane))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _respond(self, body: dict[str, Any], lane: str | None) -> None:
        tag = {"stream_id": lane} if lane is not None else {}
        try:
            async for reply, event in stream(
                Endpoint.RESPONSES, body, caller=self.scope, headers=self.credentials
            ):
                if reply.status != 200:
                    await self.send_json({"type": "error", "status": reply.status,
                                          "error": reply.error, **tag})  # fmt: skip
                    return
                if event is not None:
                    await self.send_json({**event, **tag})
        except Exception:  # the pipeline answers every request; this is a bug, reported
            logger.exception("a socket's response failed")
            await self._error(ApplicationError("The server had an error."), lane)

    async def _error(self, error: ApplicationError, lane: Any = None) -> None:
        event = {
            "type": "error",
            "status": error.status,
            "error": error.to_dict()["error"],
        }
        if isinstance(lane, str):
            event["stream_id"] = lane
        await self.send_json(event)


def _socket_request(content: Any) -> tuple[dict[str, Any], str | None]:
    """A client event's request body and lane, or the 400 why it is none."""
    if not isinstance(content, dict) or content.get("type") != "response.create":
        kind = content.get("type") if isinstance(content, dict) else None
        raise InvalidRequestError(
            f"Unsupported event type {kind!r}: send 'response.create' events."
            if kind
            else "Each message must be a JSON object with a 'type'.",
            param="type",
            code=GatewayErrorCode.UNSUPPORTED_VALUE,
        )
    for name in ("stream", "background"):
        if name in content:
            raise InvalidRequestError(
                f"'{name}' is not sent over a WebSocket: every response streams, and none runs "
                "in the background.",
                param=name,
                code=GatewayErrorCode.UNSUPPORTED_PARAMETER,
            )
    lane = content.get("stream_id")
    if not isinstance(lane, str | None):
        raise InvalidRequestError(
            "'stream_id' must be a string.", param="stream_id", code=GatewayErrorCode.INVALID_TYPE
        )
    return {name: value for name, value in content.items() if name not in _ENVELOPE}, lane
