"""Anthropic's Messages API (POST /v1/messages), served over the engine's chat completions.

In: `system`, `messages` with text, image, tool_use and tool_result blocks, `tools` with their
`input_schema`, `tool_choice`, `stop_sequences`, `max_tokens` (required, as Anthropic has it),
sampling. Out: the message object, or its event stream (message_start, content blocks with
their deltas, message_delta with the stop reason and usage, message_stop); errors in
Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).

Server tools (web search, code execution…), documents, MCP servers and thinking budgets are
refused with a 400 naming the parameter. `thinking: {"type": "disabled"}` is accepted and asks
nothing: whether a model thinks is its chat template's (a reasoning parser only separates the
thinking it writes).
"""

from __future__ import annotations

from typing import Any

import orjson

from apps.gateway.dialects.base import Answer, named_event, stream_into
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.outputs import CONTENT_FILTER, StreamEditor
from apps.gateway.schemas import (
    CompletionRequest,
    Endpoint,
    check_model,
    invalid,
    validate_completion,
)
from dmxplatform.errors import ApplicationError

_REFUSED = {
    "container": "Containers ('container') are not supported.",
    "mcp_servers": "MCP servers ('mcp_servers') are not supported.",
    "context_management": "'context_management' is not supported.",
}
# Anthropic's error types by HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# The Messages fields translated here; any other field goes to the engine as it came, as on
# /v1/chat/completions (vLLM's sampling extensions: min_p, ignore_eos…).
_OWN_FIELDS = frozenset(
    (
        *_REFUSED,
        "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stream",
        "stop_sequences", "metadata", "tools", "tool_choice", "thinking", "service_tier",
    )
)  # fmt: skip
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", CONTENT_FILTER: "refusal"}


class MessagesDialect:
    endpoint = Endpoint.MESSAGES

    def parse(self, data: dict[str, Any]) -> CompletionRequest:
        model = check_model(data)
        for name, message in _REFUSED.items():
            if data.get(name):
                raise invalid(message, name, GatewayErrorCode.UNSUPPORTED_PARAMETER)
        if data.get("max_tokens") is None:
            raise invalid(
                "max_tokens: Field required", "max_tokens", GatewayErrorCode.MISSING_PARAMETER
            )
        thinking = data.get("thinking")
        if thinking is not None and not (
            isinstance(thinking, dict) and thinking.get("type") == "disabled"
        ):
            raise invalid(
                "Thinking budgets ('thinking') are not supported: a model with a reasoning "
                "parser thinks by default, and its thinking comes back as thinking blocks.",
                "thinking",
                GatewayErrorCode.UNSUPPORTED_PARAMETER,
            )
        if data.get("n") not in (None, 1):
            raise invalid("n: Messages give one answer per request", "n")
        chat = {name: value for name, value in data.items() if name not in _OWN_FIELDS}
        chat.update(
            model=model,
            messages=[*_system(data.get("system")), *_messages(data.get("messages"))],
            max_tokens=data["max_tokens"],
        )
        temperature = data.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float)
            and not isinstance(temperature, bool)
            and 0 <= temperature <= 1
        ):
            raise invalid("temperature: must be a number between 0 and 1", "temperature")
        for name in ("temperature", "top_p", "top_k"):
            if data.get(name) is not None:
                chat[name] = data[name]
        stops = data.get("stop_sequences")
        if stops is not None:
            if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
                raise invalid(
                    "stop_sequences: must be an array of strings",
                    "stop_sequences",
                    GatewayErrorCode.INVALID_TYPE,
                )
            chat["stop"] = stops
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise invalid("metadata: must be an object", "metadata", GatewayErrorCode.INVALID_TYPE)
        user = metadata.get("user_id")
        if isinstance(user, str):
            chat["user"] = user
        if data.get("tools"):
            chat["tools"] = _tools(data["tools"])
        if data.get("tool_choice") is not None:
            _tool_choice(data["tool_choice"], chat)
        stream_into(data, chat)
        return validate_completion(Endpoint.CHAT, chat)

    def error_body(self, error: ApplicationError) -> bytes:
        return orjson.dumps(_error(error))

    def answer(
        self, completion: dict[str, Any], answer: Answer, stop: str | None
    ) -> dict[str, Any]:
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if message.get("reasoning"):
            content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            content.append(
                _tool_use(
                    call.get("id") or "",
                    function.get("name") or "",
                    function.get("arguments") or "",
                )
            )
        reason, sequence = _stop(
            choice.get("finish_reason"), stop, tool_calls=bool(message.get("tool_calls"))
        )
        return {
            **_message(answer, content, _usage(completion.get("usage"))),
            "stop_reason": reason,
            "stop_sequence": sequence,
        }

    def writer(self, answer: Answer, editor: StreamEditor) -> MessageEvents:
        return MessageEvents(answer, editor)


def _error(error: ApplicationError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(
        error.status, "api_error" if error.status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in system
    ):
        return [{"role": "system", "content": "\n\n".join(b["text"] for b in system)}]
    raise invalid(
        "system: must be a string or an array of text blocks",
        "system",
        GatewayErrorCode.INVALID_TYPE,
    )


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise invalid(
            "messages: must be a non-empty array", "messages", GatewayErrorCode.INVALID_TYPE
        )
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        param = f"messages.{index}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise invalid(f"{param}.role: must be 'user' or 'assistant'", f"{param}.role")
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            converted.append({"role": role, "content": content})
        elif isinstance(content, list):
            converted += _blocks(role, content, f"{param}.content")
        else:
            raise invalid(
                f"{param}.content: must be a string or an array of blocks",
                f"{param}.content",
                GatewayErrorCode.INVALID_TYPE,
            )
    return converted


def _blocks(role: str, blocks: list[Any], param: str) -> list[dict[str, Any]]:
    """One turn's blocks as chat messages: tool results become tool messages (before the rest
    of the user's turn), tool uses the assistant's tool calls."""
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        where = f"{param}.{index}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, where)}})
        elif kind == "tool_use" and role == "assistant":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            result = _tool_result(block.get("content"), where)
            if block.get("is_error"):  # a tool message has no flag for it: the text says so
                result = f"Error: {result}"
            tool_messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": result,
                }
            )
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier thinking: chat templates drop it from past turns
        else:
            raise invalid(
                f"{where}: blocks of type {kind!r} are not supported in a {role} turn",
                f"{where}.type",
                GatewayErrorCode.UNSUPPORTED_VALUE,
            )
    out = list(tool_messages)
    if parts or calls:
        message: dict[str, Any] = {"role": role, "content": parts or None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _tool_result(content: Any, where: str) -> str:
    """A tool result's content as the tool message's text (text blocks only: a chat tool
    message carries no images)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in content
    ):
        return "".join(b["text"] for b in content)
    raise invalid(
        f"{where}.content: a tool result must be a string or text blocks",
        f"{where}.content",
        GatewayErrorCode.UNSUPPORTED_VALUE,
    )


def _image_url(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise invalid(
        f"{where}.source: must be a base64 or url image source",
        f"{where}.source",
        GatewayErrorCode.UNSUPPORTED_VALUE,
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("tools: must be an array", "tools", GatewayErrorCode.INVALID_TYPE)
    converted = []
    for index, tool in enumerate(tools):
        param = f"tools.{index}"
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(
                f"{param}: server tools ({kind!r}) are not supported; only client tools "
                "with an input_schema",
                f"{param}.type",
                GatewayErrorCode.UNSUPPORTED_VALUE,
            )
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise invalid(
                f"{param}: a tool needs a 'name' and an 'input_schema'",
                param,
                GatewayErrorCode.INVALID_TYPE,
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if isinstance(tool.get("strict"), bool):  # Anthropic's structured tool use
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise invalid("tool_choice: must be auto, any, tool (with a name) or none", "tool_choice")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _tool_use(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    try:
        given = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        given = None
    # Anthropic's `input` is an object; arguments that are none (a model's malformed call) are
    # passed on as the text they are, under the one key a client can find them by.
    return {
        "type": "tool_use",
        "id": call_id,
        "name": name,
        "input": given if isinstance(given, dict) else {"_arguments": arguments},
    }


def _stop(
    finish_reason: str | None, stop: str | None, *, tool_calls: bool
) -> tuple[str | None, str | None]:
    if finish_reason is None:
        return None, None
    if finish_reason == "stop" and stop:
        return "stop_sequence", stop
    if finish_reason == "stop" and tool_calls:
        # vLLM ends a call it was forced to make (a named tool choice) with "stop".
        return "tool_use", None
    return _STOP_REASONS.get(finish_reason, "end_turn"), None


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    # Anthropic counts cache reads apart: input_tokens are the prompt's others.
    return {
        "input_tokens": (usage.get("prompt_tokens") or 0) - cached,
        "output_tokens": usage.get("completion_tokens") or 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _message(
    answer: Answer, content: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": answer.object_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": answer.identity.get("model", answer.request.model),
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


class MessageEvents:
    """A streamed message's events, from the engine's chat chunks: message_start (with the
    prompt's tokens), each content block (thinking, text, each tool use) started, filled by
    deltas and stopped in turn, then message_delta with the stop reason and the usage (the
    output tokens, and the prompt's split into cache reads and the rest), and message_stop."""

    final: dict[str, Any] | None = None  # nothing of these answers is stored

    def __init__(self, answer: Answer, editor: StreamEditor) -> None:
        self._answer = answer
        self._editor = editor
        self._started = False
        self._block = -1  # the open content block's index
        self._block_kind = ""
        self._finish_reason: str | None = None
        self._tool_calls = False
        self._failed = False

    def _start(self) -> bytes:
        self._started = True
        usage = _usage({"prompt_tokens": self._editor.prompt_tokens})
        return _event(
            "message_start", {"type": "message_start", "message": _message(self._answer, [], usage)}
        )

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start()]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
            if delta.get("content"):
                out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                kind = f"tool{call.get('index', 0)}"
                self._tool_calls = True
                out += self._open(
                    kind,
                    {
                        "type": "tool_use",
                        "id": call.get("id") or "",
                        "name": function.get("name") or "",
                        "input": {},
                    },
                )
                if function.get("arguments"):
                    out.append(
                        self._delta(
                            {"type": "input_json_delta", "partial_json": function["arguments"]}
                        )
                    )
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self._block_kind == kind:
            return []
        out = self._close()
        self._block += 1
        self._block_kind = kind
        out.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self._block, "content_block": block},
            )
        )
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._block, "delta": delta},
        )

    def _close(self) -> list[bytes]:
        if not self._block_kind:
            return []
        self._block_kind = ""
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self._block})]

    def end(self, *, cut: bool) -> bytes:
        if self._failed:  # the error event ended it, as Anthropic's streams end
            return b""
        out = [] if self._started else [self._start()]
        out += self._close()
        reason, sequence = _stop(
            CONTENT_FILTER if cut else self._finish_reason,
            self._editor.stop_sequence,
            tool_calls=self._tool_calls,
        )
        usage = self._editor.usage
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            # Cumulative, as Anthropic's: the engine counts cache reads only at the stream's
            # end, so message_start had the whole prompt as input_tokens; this corrects it.
            "usage": _usage(usage) if usage else {"output_tokens": 0},
        }
        out.append(_event("message_delta", delta))
        out.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, error: ApplicationError) -> bytes:
        self._failed = True
        return _event("error", _error(error))


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return named_event(kind, orjson.dumps(data))
