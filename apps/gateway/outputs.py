"""What vLLM returns, made into what the client gets: OpenAI's shape and no other, content
through the filter, usage the way OpenAI reports it, and the token counts the gateway bills."""

from __future__ import annotations

from typing import Any

import orjson

from apps.gateway.content_filter import ContentFilter, FilterAction, Match, StreamScanner, mask_text
from apps.gateway.schemas import Endpoint

CONTENT_FILTER = "content_filter"

# The fields of OpenAI's completion objects (its openapi.yaml: CreateChatCompletionResponse,
# CreateChatCompletionStreamResponse, CreateCompletionResponse and their choices, messages and
# usage). vLLM adds its own (kv_transfer_params, prompt_token_ids, prompt_logprobs, prompt_text,
# token_ids, routed_experts, ec_transfer_params, metrics, stop_reason): internals of the engine a
# client has no use for, which the platform does not pass on.
_RESPONSE_FIELDS = frozenset(
    ("id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier")
)
_CHOICE_FIELDS = {
    Endpoint.CHAT: frozenset(("index", "message", "delta", "logprobs", "finish_reason")),
    Endpoint.COMPLETIONS: frozenset(("index", "text", "logprobs", "finish_reason")),
}
# A message's (or a stream delta's) fields; `reasoning` is vLLM's one extension kept (a
# reasoning parser's output, which OpenAI's schema has no field for), and only when set.
_MESSAGE_FIELDS = frozenset(
    ("role", "content", "refusal", "tool_calls", "function_call", "audio", "annotations")
)
_MESSAGE_EXTENSIONS = frozenset(("reasoning",))
_USAGE_FIELDS = frozenset(
    (
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    )
)


def _keep_only(obj: dict[str, Any], allowed: frozenset[str]) -> None:
    for name in [name for name in obj if name not in allowed]:
        del obj[name]


def _shape(obj: dict[str, Any], endpoint: Endpoint, identity: dict[str, str]) -> None:
    """Make a completion object (or chunk) OpenAI's: its fields only, named as the client
    named the model, with the platform's fingerprint."""
    _keep_only(obj, _RESPONSE_FIELDS)
    obj.update(identity)
    choice_fields = _CHOICE_FIELDS[endpoint]
    for choice in obj.get("choices") or ():
        _keep_only(choice, choice_fields)
        holder = choice.get("message") or choice.get("delta")
        if holder:
            for name in [name for name in holder if name not in _MESSAGE_FIELDS]:
                if name not in _MESSAGE_EXTENSIONS or holder[name] is None:
                    del holder[name]
    usage = obj.get("usage")
    if usage:
        _keep_only(usage, _USAGE_FIELDS)


def identity(*, model: str, version_tag: str) -> dict[str, str]:
    """What every answer says of where it came from: the model as the client named it (OpenAI
    answers so too) and a fingerprint of the platform's model version that served it."""
    return {"model": model, "system_fingerprint": f"fp_dmx_{version_tag}"}


def _text_of(choice: dict[str, Any], endpoint: Endpoint) -> str | None:
    if endpoint is Endpoint.CHAT:
        holder = choice.get("delta") or choice.get("message") or {}
        return holder.get("content")
    return choice.get("text")


def _set_text(choice: dict[str, Any], endpoint: Endpoint, text: str) -> None:
    if endpoint is Endpoint.CHAT:
        holder = choice.get("delta") if "delta" in choice else choice.setdefault("message", {})
        holder["content"] = text
    else:
        choice["text"] = text


class StreamEditor:
    """Rewrite one streamed completion's chunks, in order.

    vLLM is asked for usage on every chunk (continuous usage stats) so that a stream cut short
    is billed exactly; clients get usage only as OpenAI sends it: nowhere unless they asked for
    it, and then null on every chunk but a last, choice-less one.
    """

    def __init__(
        self,
        content_filter: ContentFilter,
        *,
        endpoint: Endpoint,
        include_usage: bool,
        identity: dict[str, str] | None = None,
    ):
        """`identity`: the fields every chunk answers with (outputs.identity)."""
        self._filter = content_filter
        self._identity_fields = identity or {}
        self._endpoint = endpoint
        self._include_usage = include_usage
        self._scanners: dict[int, StreamScanner] = {}
        self._final_usage: dict[str, Any] | None = None
        self._choice_usage: dict[int, dict[str, Any]] = {}
        self.blocked: Match | None = None
        self.first_content = False
        self._identity: dict[str, Any] = {}

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage to bill: vLLM's closing total, or, for a stream cut short, the sum of the
        latest per-choice counts (with n > 1 each chunk's usage covers its own choice only)."""
        if self._final_usage is not None or not self._choice_usage:
            return self._final_usage
        latest = list(self._choice_usage.values())
        completion = sum(u.get("completion_tokens") or 0 for u in latest)
        prompt = latest[0].get("prompt_tokens") or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def flags(self) -> list[str]:
        return sorted({m.term for s in self._scanners.values() for m in s.flags})

    def _scanner(self, index: int) -> StreamScanner:
        scanner = self._scanners.get(index)
        if scanner is None:
            scanner = self._scanners[index] = StreamScanner(self._filter)
        return scanner

    def edit(self, data: bytes) -> bytes | None:
        """Return the chunk to send for one upstream `data:` payload, or None to send nothing."""
        chunk = orjson.loads(data)
        usage = chunk.pop("usage", None)
        _shape(chunk, self._endpoint, self._identity_fields)
        if not self._identity:
            self._identity = {
                k: chunk[k]
                for k in ("id", "object", "created", "model", "system_fingerprint")
                if k in chunk
            }
        choices = chunk.get("choices")
        if not choices:
            if usage is None:
                return None
            self._final_usage = usage
            if not self._include_usage:
                return None
            chunk["usage"] = _client_usage(usage)
            return orjson.dumps(chunk)
        if usage and len(choices) == 1:
            self._choice_usage[choices[0].get("index", 0)] = usage
        for choice in choices:
            self._edit_choice(choice)
        if self._include_usage:
            chunk["usage"] = None
        return orjson.dumps(chunk)

    def usage_chunk(self) -> bytes:
        """The closing usage chunk, for a stream the gateway ends itself."""
        return orjson.dumps({**self._identity, "choices": [], "usage": _client_usage(self.usage)})

    def _edit_choice(self, choice: dict[str, Any]) -> None:
        scanner = self._scanner(choice.get("index", 0))
        text = _text_of(choice, self._endpoint)
        if text:
            self.first_content = True
            safe, block = scanner.feed(text)
            if block is not None:
                self.blocked = block
                choice["finish_reason"] = CONTENT_FILTER
            _set_text(choice, self._endpoint, safe)
        if choice.get("finish_reason") and self.blocked is None:
            held = scanner.flush()
            if scanner.blocked is not None:
                self.blocked = scanner.blocked
                choice["finish_reason"] = CONTENT_FILTER
            if held:
                _set_text(choice, self._endpoint, (_text_of(choice, self._endpoint) or "") + held)


def _client_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage as OpenAI reports it (the billed one, vLLM's, may carry more)."""
    if usage is None:
        return None
    return {name: value for name, value in usage.items() if name in _USAGE_FIELDS}


def filter_response(
    body: bytes,
    content_filter: ContentFilter,
    *,
    endpoint: Endpoint,
    identity: dict[str, str] | None = None,
) -> tuple[bytes, dict[str, Any] | None, list[str], bool]:
    """Shape and filter a whole (non-streamed) completion; return the body, the usage to bill,
    flags, blocked."""
    response = orjson.loads(body)
    usage = response.get("usage")
    _shape(response, endpoint, identity or {})
    if not len(content_filter):
        return orjson.dumps(response), usage, [], False
    flags: set[str] = set()
    blocked = False
    for choice in response.get("choices") or ():
        text = _text_of(choice, endpoint)
        if not text:
            continue
        matches = content_filter.scan(text)
        if not matches:
            continue
        flags.update(m.term for m in matches if m.action is FilterAction.FLAG)
        block = next((m for m in matches if m.action is FilterAction.BLOCK), None)
        visible = text[: block.start] if block else text
        edited = mask_text(visible, [m for m in matches if m.end <= len(visible)])
        if block is not None:
            blocked = True
            choice["finish_reason"] = CONTENT_FILTER
        if edited != text:
            _set_text(choice, endpoint, edited)
    return orjson.dumps(response), usage, sorted(flags), blocked
