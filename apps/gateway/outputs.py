"""What vLLM returns, made into what the client gets: OpenAI's shape and no other, content
through the filter, usage the way OpenAI reports it, and the token counts the gateway bills."""

from __future__ import annotations

from typing import Any, NamedTuple

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
# OpenAI's breakdown of the prompt's tokens; vLLM's adds created_cache_tokens and
# multimodal_tokens (null on a text model's prompts).
_PROMPT_DETAILS_FIELDS = frozenset(("cached_tokens", "audio_tokens"))


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
    if obj.get("usage"):
        # A copy: the engine's own usage is the one billed.
        obj["usage"] = _client_usage(obj["usage"])


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
        holder = choice["delta"] if "delta" in choice else choice.setdefault("message", {})
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
        # Per choice (its index), for its reasoning and per tool call of a choice ((choice,
        # _REASONING) and (choice, call) indices).
        self._scanners: dict[int | tuple[int, int], StreamScanner] = {}
        self._open_call: dict[int, int] = {}  # each choice's tool call being streamed
        self._final_usage: dict[str, Any] | None = None
        self._choice_usage: dict[int, dict[str, Any]] = {}
        self.blocked: Match | None = None
        self.first_content = False
        # The prompt's tokens as the engine counted them (its first chunk's usage), and the
        # stop string that ended a choice, for the dialects that report them (Anthropic's).
        self.prompt_tokens: int | None = None
        self.stop_sequence: str | None = None
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

    def _scanner(self, index: int | tuple[int, int]) -> StreamScanner:
        scanner = self._scanners.get(index)
        if scanner is None:
            scanner = self._scanners[index] = StreamScanner(self._filter)
        return scanner

    def edit(self, data: bytes) -> dict[str, Any] | None:
        """Return the chunk to send for one upstream `data:` payload, or None to send nothing."""
        chunk = orjson.loads(data)
        usage = chunk.pop("usage", None)
        choices = chunk.get("choices")
        for choice in choices or ():
            # vLLM's `stop_reason` (which stop string ended the choice) is an internal field of
            # OpenAI's shape, but Anthropic's (`stop_sequence`) says it: kept aside.
            stop = choice.get("stop_reason")
            if isinstance(stop, str):
                self.stop_sequence = stop
        _shape(chunk, self._endpoint, self._identity_fields)
        if not self._identity:
            self._identity = {
                k: chunk[k]
                for k in ("id", "object", "created", "model", "system_fingerprint")
                if k in chunk
            }
        if not choices:
            if usage is None:
                return None
            self._final_usage = usage
            if not self._include_usage:
                return None
            chunk["usage"] = _client_usage(usage)
            return chunk
        if usage:
            if len(choices) == 1:
                self._choice_usage[choices[0].get("index", 0)] = usage
            if self.prompt_tokens is None:
                self.prompt_tokens = usage.get("prompt_tokens")
        for choice in choices:
            self._edit_choice(choice)
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self) -> dict[str, Any]:
        """The closing usage chunk, for a stream the gateway ends itself."""
        return {**self._identity, "choices": [], "usage": _client_usage(self.usage)}

    def _edit_choice(self, choice: dict[str, Any]) -> None:
        """Screen one choice's delta: its reasoning, its text and each tool call's arguments,
        each on a scanner of its own (a term split between two of them is no term).

        What a scanner holds back is released before output of another kind follows (reasoning
        before text, both before a tool call, one call's arguments before the next call's), so
        that the output keeps the engine's order: the Responses and Messages writers close an
        item when the next kind starts, and text released after a call would open a second
        message, arguments a second call."""
        index = choice.get("index", 0)
        holder: dict[str, Any] = choice.get("delta", choice)
        reasoning = holder.get("reasoning") if self._endpoint is Endpoint.CHAT else None
        if reasoning:
            self.first_content = True
            holder["reasoning"] = self._feed((index, _REASONING), reasoning, choice)
        text = _text_of(choice, self._endpoint)
        if text:
            self.first_content = True
            self._release((index, _REASONING), "reasoning", choice)
            _set_text(choice, self._endpoint, self._feed(index, text, choice))
        calls = _tool_calls(choice)
        if calls:
            self.first_content = True
            self._release((index, _REASONING), "reasoning", choice)
            self._release(index, "content", choice)
            holder["tool_calls"] = self._edit_calls(index, calls, choice)
        if choice.get("finish_reason") and self.blocked is None:
            self._release((index, _REASONING), "reasoning", choice)
            self._release(index, "content", choice)
            current = self._open_call.get(index)
            if current is not None:
                held = self._flush((index, current), choice)
                if held:
                    _tool_calls_of(holder).append(_arguments(current, held))

    def _feed(self, key: int | tuple[int, int], text: str, choice: dict[str, Any]) -> str:
        """What of `text` is safe to send now; a blocked term ends the choice."""
        if self.blocked is not None:
            return ""
        safe, block = self._scanner(key).feed(text)
        if block is not None:
            self.blocked = block
            choice["finish_reason"] = CONTENT_FILTER
        return safe

    def _flush(self, key: int | tuple[int, int], choice: dict[str, Any]) -> str:
        scanner = self._scanners.get(key)
        if scanner is None or self.blocked is not None:
            return ""
        held = scanner.flush()
        if scanner.blocked is not None:
            self.blocked = scanner.blocked
            choice["finish_reason"] = CONTENT_FILTER
            return ""
        return held

    def _release(self, key: int | tuple[int, int], field: str, choice: dict[str, Any]) -> None:
        """Send what the scanner of `key` holds with this chunk's `field` (text or reasoning)."""
        held = self._flush(key, choice)
        if held and field == "content":
            _set_text(choice, self._endpoint, (_text_of(choice, self._endpoint) or "") + held)
        elif held:
            holder = choice.setdefault("delta", {})
            holder[field] = (holder.get(field) or "") + held

    def _edit_calls(
        self, index: int, calls: list[dict[str, Any]], choice: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The tool calls to send: arguments screened; none after a blocked term."""
        sent: list[dict[str, Any]] = []
        for call in calls:
            if self.blocked is not None:
                break
            number = call.get("index", 0)
            previous = self._open_call.get(index)
            if previous is not None and previous != number:
                held = self._flush((index, previous), choice)
                if held:
                    sent.append(_arguments(previous, held))
            self._open_call[index] = number
            function = call.get("function") or {}
            if function.get("arguments"):
                function["arguments"] = self._feed((index, number), function["arguments"], choice)
            sent.append(call)
        return sent


# The scanner key of a choice's reasoning: (choice index, _REASONING); tool calls' are
# (choice index, call index), call indices counting from 0.
_REASONING = -1


def _arguments(number: int, text: str) -> dict[str, Any]:
    """A tool-call delta that carries arguments only."""
    return {"index": number, "function": {"arguments": text}}


def _tool_calls_of(holder: dict[str, Any]) -> list[dict[str, Any]]:
    calls = holder.get("tool_calls")
    if calls is None:
        calls = holder["tool_calls"] = []
    return calls


def _tool_calls(choice: dict[str, Any]) -> list[dict[str, Any]]:
    holder = choice.get("delta") or choice.get("message") or {}
    return holder.get("tool_calls") or []


def _client_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage as OpenAI reports it (the billed one, vLLM's, may carry more)."""
    if usage is None:
        return None
    shown = {name: value for name, value in usage.items() if name in _USAGE_FIELDS}
    details = shown.get("prompt_tokens_details")
    if details:
        shown["prompt_tokens_details"] = {
            name: value for name, value in details.items() if name in _PROMPT_DETAILS_FIELDS
        }
    return shown


class FilteredAnswer(NamedTuple):
    response: dict[str, Any]  # OpenAI's shape, filtered
    usage: dict[str, Any] | None  # to bill: vLLM's
    flags: list[str]
    blocked: bool
    stop_sequence: str | None  # the stop string that ended the first choice, if one did


def filter_response(
    body: bytes,
    content_filter: ContentFilter,
    *,
    endpoint: Endpoint,
    identity: dict[str, str] | None = None,
) -> FilteredAnswer:
    """Shape and filter a whole (non-streamed) completion."""
    response = orjson.loads(body)
    usage = response.get("usage")
    choices = response.get("choices") or ()
    stop = choices[0].get("stop_reason") if choices else None
    stop = stop if isinstance(stop, str) else None
    _shape(response, endpoint, identity or {})
    if not len(content_filter):
        return FilteredAnswer(response, usage, [], False, stop)
    flags: set[str] = set()
    blocked = False
    for choice in response.get("choices") or ():
        message = choice.get("message") if endpoint is Endpoint.CHAT else None
        block = False
        if message and isinstance(message.get("reasoning"), str):
            message["reasoning"], found, block = _filtered(content_filter, message["reasoning"])
            flags.update(found)
        text = _text_of(choice, endpoint)
        if text:
            edited, found, text_block = _filtered(content_filter, "" if block else text)
            flags.update(found)
            if edited != text:
                _set_text(choice, endpoint, edited)
            block |= text_block
        calls = _tool_calls(choice)
        for call in calls:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                function["arguments"], found, call_block = _filtered(content_filter, arguments)
                flags.update(found)
                block |= call_block
        if block:
            # A choice with a blocked term ends there: the calls it asked for are not made.
            calls.clear()
            choice["finish_reason"] = CONTENT_FILTER
            blocked = True
    return FilteredAnswer(response, usage, sorted(flags), blocked, stop)


_EMBEDDING_USAGE_FIELDS = ("prompt_tokens", "total_tokens")


def embeddings_answer(body: bytes, *, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An embeddings response in OpenAI's shape (its object, data, model as the client named
    it, and usage of prompt and total tokens), and the usage to bill."""
    response = orjson.loads(body)
    usage = response.get("usage") or {}
    answer = {
        "object": "list",
        "data": response.get("data") or [],
        "model": model,
        "usage": {name: usage.get(name) or 0 for name in _EMBEDDING_USAGE_FIELDS},
    }
    return answer, usage


def _filtered(content_filter: ContentFilter, text: str) -> tuple[str, set[str], bool]:
    """The text masked (cut before a blocked term), the flagged terms, and whether it blocked."""
    matches = content_filter.scan(text)
    if not matches:
        return text, set(), False
    flags = {m.term for m in matches if m.action is FilterAction.FLAG}
    block = next((m for m in matches if m.action is FilterAction.BLOCK), None)
    visible = text[: block.start] if block else text
    return (
        mask_text(visible, [m for m in matches if m.end <= len(visible)]),
        flags,
        block is not None,
    )
