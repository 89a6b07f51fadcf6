"""One completion request through the gateway, stage by stage.

authenticate (key, client network, signature) -> parse -> resolve model -> screen the prompt ->
classify intent -> count prompt tokens against the context allowed now -> admit against limits
and quotas (one Redis round trip) -> route and connect -> relay, through the output filter ->
settle (one Redis round trip: refund, free the slot, append usage).

Each stage is timed; the timings go into the usage record with the request id. The usage event
is appended before the response's last bytes leave, so a response a client received always has
its record, and a request is billed exactly: prompt and completion tokens as vLLM counted them,
nothing for a node that failed before the first token, what was generated when a client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import aiohttp

from apps.gateway import sse
from apps.gateway.admission import admit, reservation
from apps.gateway.auth import authenticate, check_network, check_signature
from apps.gateway.clients import client_address
from apps.gateway.context import check_context, context_limit, prompt_tokens
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.intent import classify
from apps.gateway.outputs import StreamEditor, filter_response
from apps.gateway.prompts import intent_text, screen_prompt
from apps.gateway.responses import EVENT_STREAM, Headers, header, read_body, send_error, send_json
from apps.gateway.runtime import GatewayRuntime, get_runtime
from apps.gateway.schemas import CompletionRequest, Endpoint, parse_json, validate_completion
from apps.gateway.upstream import connect, upstream_error
from apps.keys.choices import UsageStatus
from apps.keys.keycache import KeyRecord
from apps.keys.ledger import UsageEvent
from apps.keys.ratelimit import Admission
from apps.models.catalog import ModelEntry
from apps.routing.router import Decision
from dmxplatform import metrics
from dmxplatform.errors import ApplicationError, NotFoundError, UpstreamError

logger = logging.getLogger(__name__)

# Request bodies above this are refused before parsing: 8 MiB holds any prompt a 1M-token
# context accepts, and stops a client from making the gateway buffer arbitrary amounts.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Without a tokenizer for the model, a prompt's tokens are estimated from its length.
CHARS_PER_TOKEN = 4


def new_request_id() -> str:
    return "req_" + os.urandom(16).hex()


def resolve_model(runtime: GatewayRuntime, key: KeyRecord, name: str) -> ModelEntry:
    """Return the model a request names, if it exists and the key may use it."""
    entry = runtime.catalog.get(name)
    if entry is None or not key.allows(name):
        raise NotFoundError(
            f"The model `{name}` does not exist or you do not have access to it.",
            param="model",
            code=GatewayErrorCode.MODEL_NOT_FOUND,
        )
    return entry


class CompletionCall:
    """The state of one chat or text completion request, from first byte to usage record."""

    def __init__(self, endpoint: Endpoint, scope: dict[str, Any], receive, send) -> None:
        self.endpoint = endpoint
        self.scope = scope
        self.receive = receive
        self.send = send
        self.request_id = new_request_id()
        self.received_at = time.time()
        self._t0 = time.perf_counter()
        self._last = self._t0
        self.timings: dict[str, float] = {}
        self.headers: Headers = [(b"x-request-id", self.request_id.encode())]
        self.key: KeyRecord | None = None
        self.request: CompletionRequest | None = None
        self.admission: Admission | None = None
        self.decision: Decision | None = None
        self.editor: StreamEditor | None = None
        self.http_status = 200
        self.outcome = UsageStatus.OK
        self.error_code = ""
        self.intent = ""
        self.estimated_tokens: int | None = None
        self.context_limit: int | None = None
        self.reserved = 0
        self.flags: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        self.response_started = False
        self.settled = False

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round((now - self._last) * 1000, 3)
        self._last = now

    async def run(self) -> None:
        runtime: GatewayRuntime | None = None
        try:
            runtime = await get_runtime()
            body = await read_body(self.receive, MAX_BODY_BYTES)
            key = self.key = await authenticate(runtime.keys, header(self.scope, b"authorization"))
            check_network(key, client_address(self.scope, runtime.trusted_proxies))
            nonce = check_signature(key, self.scope, body)
            self.mark("auth")
            request = self.request = validate_completion(self.endpoint, parse_json(body))
            self.mark("parse")
            model = resolve_model(runtime, key, request.model)
            self.flags = screen_prompt(runtime.content_filter, request)
            self.mark("screen")
            self.intent = classify(intent_text(request)).label
            self.mark("intent")
            await self._admit(runtime, key, model, request, nonce)
            async with connect(runtime, request) as (decision, response):
                self.decision = decision
                self.mark("upstream_connect")
                if response.status != 200:
                    raise upstream_error(response.status, await response.read())
                if request.stream:
                    await self._stream(runtime, response)
                else:
                    await self._respond(runtime, response)
        except ApplicationError as error:
            await self._fail(runtime, error)
        except Exception:
            logger.exception("request %s failed", self.request_id)
            await self._fail(
                runtime, ApplicationError("The server had an error while processing your request.")
            )
        finally:
            metrics.gateway_request_duration.labels(
                self.endpoint.value,
                str(self.http_status),
                "true" if self.request and self.request.stream else "false",
            ).observe(time.perf_counter() - self._t0)

    async def _admit(
        self,
        runtime: GatewayRuntime,
        key: KeyRecord,
        model: ModelEntry,
        request: CompletionRequest,
        nonce: str | None,
    ) -> None:
        """Count the prompt against the context allowed now, then reserve against limits."""
        tokens = prompt_tokens(model, request)
        limit = self.context_limit = context_limit(model, runtime.fleet)
        check_context(model, request, tokens, limit)
        self.estimated_tokens = tokens
        if tokens is None:
            tokens = len(intent_text(request)) // CHARS_PER_TOKEN + 1
        self.mark("context")
        self.reserved = reservation(request, tokens, limit)
        self.admission = await admit(
            runtime.limiter,
            request_id=self.request_id,
            key=key,
            model=model.name,
            reserve=self.reserved,
            nonce=nonce,
        )
        self.headers += self.admission.headers()
        self.mark("limits")

    async def _fail(self, runtime: GatewayRuntime | None, error: ApplicationError) -> None:
        self.http_status = error.status
        self.error_code = str(error.code)
        if self.outcome is UsageStatus.OK:
            self.outcome = (
                UsageStatus.UPSTREAM_ERROR
                if isinstance(error, UpstreamError)
                else UsageStatus.REJECTED
            )
        await self._settle(runtime)
        if self.response_started:
            # Mid-stream: the status line is gone; tell the client in the stream, as OpenAI does.
            await self._send_body(sse.encode(error.to_json()), more=False)
            return
        await send_error(self.send, error, self.headers)

    async def _respond(self, runtime: GatewayRuntime, response: aiohttp.ClientResponse) -> None:
        data = await response.read()
        self.mark("upstream")
        self.first_token_at = time.perf_counter()
        data, self.usage, flags, blocked = filter_response(
            data, runtime.content_filter, endpoint=self.endpoint
        )
        self.flags = sorted({*self.flags, *flags})
        if blocked:
            self.outcome = UsageStatus.CONTENT_FILTERED
        await self._settle(runtime)
        await send_json(self.send, 200, data, self.headers)

    async def _stream(self, runtime: GatewayRuntime, response: aiohttp.ClientResponse) -> None:
        relay = asyncio.ensure_future(self._relay(runtime, response))
        disconnect = asyncio.ensure_future(self._wait_disconnect())
        done, _ = await asyncio.wait((relay, disconnect), return_when=asyncio.FIRST_COMPLETED)
        if relay in done:
            disconnect.cancel()
            relay.result()
            return
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        # The client left: charge what was generated; closing the response aborts vLLM's work.
        self.outcome = UsageStatus.CLIENT_DISCONNECTED
        self.http_status = 499  # nginx's "client closed request"
        await self._settle(runtime)

    async def _wait_disconnect(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _relay(self, runtime: GatewayRuntime, response: aiohttp.ClientResponse) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", EVENT_STREAM),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # proxies must not hold events back
                    *self.headers,
                ],
            }
        )
        self.response_started = True
        editor = self.editor = StreamEditor(
            runtime.content_filter, endpoint=self.endpoint, include_usage=self.request.include_usage
        )
        splitter = sse.EventSplitter()
        async for chunk in response.content.iter_any():
            out = []
            for event in splitter.feed(chunk):
                data = sse.data_of(event)
                if data is None:
                    continue
                if data == sse.DONE:
                    await self._settle(runtime)
                    out.append(sse.encode(sse.DONE))
                    continue
                if data.startswith(b'{"error"'):
                    self.outcome = UsageStatus.UPSTREAM_ERROR
                    self.error_code = GatewayErrorCode.UPSTREAM_ERROR
                    out.append(sse.encode(data))
                    continue
                edited = editor.edit(data)
                if editor.first_content and self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                if edited is not None:
                    out.append(sse.encode(edited))
                if editor.blocked is not None:
                    await self._end_blocked(runtime, out)
                    return
            if out:
                await self._send_body(b"".join(out), more=True)
        self.mark("upstream")
        if not self.settled:
            # The node closed the stream without [DONE]: it failed mid-generation.
            raise UpstreamError(
                "The model server ended the stream early.", code=GatewayErrorCode.UPSTREAM_ERROR
            )
        await self._send_body(b"", more=False)

    async def _end_blocked(self, runtime: GatewayRuntime, out: list[bytes]) -> None:
        """The output hit a blocked term: finish the stream here, bill what was generated."""
        self.outcome = UsageStatus.CONTENT_FILTERED
        self.mark("upstream")
        await self._settle(runtime)
        if self.request.include_usage and self.editor.usage:
            out.append(sse.encode(self.editor.usage_chunk()))
        out.append(sse.encode(sse.DONE))
        await self._send_body(b"".join(out), more=False)

    async def _send_body(self, body: bytes, *, more: bool) -> None:
        await self.send({"type": "http.response.body", "body": body, "more_body": more})

    def _usage_event(self, prompt: int, completion: int) -> UsageEvent:
        node = self.decision.node if self.decision else None
        return UsageEvent(
            request_id=self.request_id,
            api_key_id=self.key.id,
            tenant_id=self.key.tenant_id,
            created_at=self.received_at,
            endpoint=self.endpoint.value,
            model=self.request.model if self.request else "",
            model_version=node.version_tag if node else "",
            node=node.name if node else "",
            intent=self.intent,
            stream=bool(self.request and self.request.stream),
            status=self.outcome.value,
            http_status=self.http_status,
            error_code=self.error_code,
            prompt_tokens=prompt,
            completion_tokens=completion,
            duration_ms=round((time.perf_counter() - self._t0) * 1000, 3),
            time_to_first_token_ms=(
                round((self.first_token_at - self._t0) * 1000, 3) if self.first_token_at else None
            ),
            estimated_prompt_tokens=self.estimated_tokens,
            context_limit=self.context_limit,
            content_flags=sorted({*self.flags, *(self.editor.flags() if self.editor else ())}),
            timings=self.timings,
        )

    async def _settle(self, runtime: GatewayRuntime | None) -> None:
        """Refund the reservation's excess and append the usage record; once per request."""
        if self.settled or self.key is None or runtime is None:
            return
        self.settled = True
        usage = (self.editor.usage if self.editor else None) or self.usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        event = self._usage_event(prompt, completion)
        rules = self.admission.rules if self.admission else ()
        try:
            await runtime.limiter.settle(
                self.request_id,
                rules,
                refund=self.reserved - prompt - completion,
                event=event.encode(),
            )
        except Exception:
            # Redis is gone mid-request: keep the record in the log, where it can be replayed.
            logger.error("usage-unrecorded %s", event.encode().decode())
        if prompt or completion:
            metrics.gateway_tokens.labels(event.model, "prompt").inc(prompt)
            metrics.gateway_tokens.labels(event.model, "completion").inc(completion)
