"""OpenAI's Responses API (POST /v1/responses), served over the engine's chat completions.

In: `input` (a string or items: messages, function calls and their outputs), `instructions`,
function `tools`, `tool_choice`, `text.format` (json_object, json_schema), `max_output_tokens`,
`reasoning.effort`, sampling. Out: the response object, or its event stream as OpenAI sends it
(response.created … output items, their parts and deltas … response.completed), with usage,
ended by `data: [DONE]` as the Open Responses specification has it. The object repeats every
setting OpenAI's and Open Responses' response objects carry: as sent, else what was used.

What needs state kept between requests (stored responses, `previous_response_id`,
conversations, background runs) or tools that run on OpenAI's side (web search, file search,
code interpreter, computer use, MCP) is refused with a 400 naming the parameter.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from apps.gateway import sse
from apps.gateway.dialects.base import Answer, named_event, stream_into
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.outputs import CONTENT_FILTER, StreamEditor
from apps.gateway.schemas import (
    CompletionRequest,
    Endpoint,
    check_model,
    invalid,
    optional_int,
    optional_number,
    validate_completion,
)
from dmxplatform.errors import ApplicationError, InvalidRequestError

# Parameters that need what the platform does not keep or run, with the reason a client reads.
_REFUSED = {
    "conversation": "Conversations ('conversation') are not supported: continue a stored "
    "response with 'previous_response_id', or send the conversation's items in 'input'.",
    "prompt": "Stored prompt templates ('prompt') are not supported.",
    "logprobs": "Log probabilities are not supported on /v1/responses; use "
    "/v1/chat/completions with 'logprobs'.",
    "context_management": "'context_management' is not supported.",
}
_SAMPLING = ("temperature", "top_p", "parallel_tool_calls", "user", "service_tier")
_MAX_TOP_LOGPROBS = 20  # OpenAI's bound
# OpenAI's bound on presence_penalty and frequency_penalty (vLLM's too); the engine applies them.
_MAX_PENALTY = 2.0
# The Responses fields translated (or answered) here; any other field goes to the engine as it
# came, as on /v1/chat/completions (vLLM's sampling extensions: top_k, min_p, ignore_eos…).
_OWN_FIELDS = frozenset(
    (
        *_REFUSED,
        *_SAMPLING,
        "model", "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
        "reasoning", "stream", "stream_options", "store", "background", "truncation", "include",
        "metadata", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
        "top_logprobs", "max_tool_calls",
    )
)  # fmt: skip
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _unsupported(message: str, param: str) -> InvalidRequestError:
    return invalid(message, param, GatewayErrorCode.UNSUPPORTED_PARAMETER)


class ResponsesDialect:
    endpoint = Endpoint.RESPONSES

    def parse(self, data: dict[str, Any]) -> CompletionRequest:
        model = check_model(data)
        for name, message in _REFUSED.items():
            if data.get(name) is not None:
                raise _unsupported(message, name)
        for name in ("store", "background"):
            if not isinstance(data.get(name), bool | None):
                raise invalid(f"'{name}' must be a boolean.", name, GatewayErrorCode.INVALID_TYPE)
        if data.get("background") and data.get("store") is False:
            raise invalid(
                "'background': true needs 'store': true: a background response is stored to be "
                "polled.",
                "background",
                GatewayErrorCode.UNSUPPORTED_VALUE,
            )
        if data.get("truncation") not in (None, "disabled"):
            raise invalid(
                "Only 'truncation': 'disabled' is supported: a prompt longer than the context "
                "is refused, never cut.",
                "truncation",
                GatewayErrorCode.UNSUPPORTED_VALUE,
            )
        if not isinstance(data.get("metadata") or {}, dict):
            raise invalid(
                "'metadata' must be an object.", "metadata", GatewayErrorCode.INVALID_TYPE
            )
        include = data.get("include")
        if include:  # [] is what clients send by default
            raise invalid(
                "'include' is not supported: reasoning is returned as text, not encrypted.",
                "include",
                GatewayErrorCode.UNSUPPORTED_VALUE,
            )
        if data.get("n") not in (None, 1):
            raise _unsupported("The Responses API gives one answer per request ('n').", "n")
        _check_echoed(data)
        chat = {name: value for name, value in data.items() if name not in _OWN_FIELDS}
        chat.update(model=model, messages=_messages(data))
        for name in _SAMPLING:
            if data.get(name) is not None:
                chat[name] = data[name]
        if data.get("max_output_tokens") is not None:
            chat["max_completion_tokens"] = data["max_output_tokens"]
        if data.get("tools"):
            chat["tools"] = _tools(data["tools"])
        if data.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(data["tool_choice"])
        response_format = _response_format(data.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        effort = _reasoning_effort(data.get("reasoning"))
        if effort is not None:
            chat["reasoning_effort"] = effort
        stream_into(data, chat)
        try:
            request = validate_completion(Endpoint.CHAT, chat)
        except InvalidRequestError as error:
            raise _as_sent(error) from None
        request.client_prompt_param = "input"
        request.response_settings = _settings(data)
        if request.response_settings["store"]:
            request.response_input = _input_items(data["input"])
        return request

    def error_body(self, error: ApplicationError) -> bytes:
        return error.to_json()

    def answer(
        self, completion: dict[str, Any], answer: Answer, stop: str | None
    ) -> dict[str, Any]:
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        items = _Items(answer)
        if message.get("reasoning"):
            items.reasoning(message["reasoning"])
        if message.get("content") or not message.get("tool_calls"):
            items.message(message.get("content") or "")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            items.function_call(
                call.get("id") or "", function.get("name") or "", function.get("arguments") or ""
            )
        # The item being written when generation stopped ends as the response does: incomplete
        # at the token budget or the content filter (Open Responses' item states).
        status, _ = _status(choice.get("finish_reason"))
        items.output[-1]["status"] = status
        return _response(answer, items.output, choice.get("finish_reason"), completion.get("usage"))

    def writer(self, answer: Answer, editor: StreamEditor) -> ResponseEvents:
        return ResponseEvents(answer, editor)


def _check_echoed(data: dict[str, Any]) -> None:
    """Check the settings the response object repeats that no other check covers, so that it
    repeats each as a value of its type."""
    # Top log probabilities come only with log probabilities, which are refused: 0 asks for none.
    if optional_int(data, "top_logprobs", 0, _MAX_TOP_LOGPROBS):
        raise invalid(_REFUSED["logprobs"], "top_logprobs", GatewayErrorCode.UNSUPPORTED_VALUE)
    # OpenAI's max_tool_calls bounds calls to built-in tools; none run here, so any bound holds.
    optional_int(data, "max_tool_calls", 0)
    for name in ("presence_penalty", "frequency_penalty"):
        optional_number(data, name, -_MAX_PENALTY, _MAX_PENALTY)
    # Hints to OpenAI's abuse detection and prompt cache, kept from the engine, which caches
    # prompt prefixes by itself.
    for name in ("safety_identifier", "prompt_cache_key"):
        if not isinstance(data.get(name), str | None):
            raise invalid(f"'{name}' must be a string.", name, GatewayErrorCode.INVALID_TYPE)


def _client_param(param: str | None) -> str | None:
    """A chat parameter's name as the Responses request spelt it."""
    if param is None:
        return None
    renames = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format"}
    if param.startswith("messages"):
        return "input"
    return renames.get(param, param)


def _as_sent(error: InvalidRequestError) -> InvalidRequestError:
    """A refusal of the translated chat request, naming the parameter (in `param` and in the
    message) as the client sent it."""
    param = _client_param(error.param)
    message = error.message
    if error.param and param != error.param:
        message = message.replace(f"'{error.param}'", f"'{param}'")
    return invalid(message, param, error.code)


def _text(content: Any, param: str) -> list[dict[str, Any]] | str:
    """An input message's content as chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(
            f"'{param}' must be a string or an array of content parts.",
            param,
            GatewayErrorCode.INVALID_TYPE,
        )
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        where = f"{param}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise invalid(
                    f"'{where}.text' must be a string.",
                    f"{where}.text",
                    GatewayErrorCode.INVALID_TYPE,
                )
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _unsupported(
                    "Images are taken by 'image_url' only (no 'file_id': files are not stored).",
                    f"{where}.image_url",
                )
            image = {"url": url}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise _unsupported(
                f"Content parts of type {kind!r} are not supported.", f"{where}.type"
            )
    return parts


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages: function calls become the assistant turn's
    tool calls, their outputs tool messages."""
    messages: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid(
                "'instructions' must be a string.", "instructions", GatewayErrorCode.INVALID_TYPE
            )
        messages.append({"role": "system", "content": instructions})
    given = data.get("input")
    if given is None:
        raise invalid("'input' is required.", "input", GatewayErrorCode.MISSING_PARAMETER)
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise invalid(
            "'input' must be a string or an array of items.", "input", GatewayErrorCode.INVALID_TYPE
        )
    for index, item in enumerate(given):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise invalid(f"'{param}' must be an object.", param, GatewayErrorCode.INVALID_TYPE)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise invalid(
                    f"'{param}.role' must be one of {', '.join(sorted(_ROLES))}.", f"{param}.role"
                )
            messages.append(
                {"role": role, "content": _text(item.get("content"), f"{param}.content")}
            )
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant":  # the turn that made the call
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{param}.output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", param),
                    "content": content,
                }
            )
        elif kind == "reasoning":
            # A reasoning model's earlier thinking: chat templates drop it from past turns, as
            # vLLM's own Responses server does.
            continue
        else:
            raise _unsupported(
                f"Input items of type {kind!r} are not supported (no stored items, no "
                "built-in tools).",
                f"{param}.type",
            )
    if not any(m["role"] != "system" for m in messages):
        raise invalid("'input' must hold at least one item.", "input")
    return messages


def _input_items(given: Any) -> list[dict[str, Any]]:
    """The request's input as the items a stored response lists (apps.gateway.stored): a
    string is the user's message."""
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return list(given)


def continue_from(data: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Put a stored conversation's items (previous_response_id's) before the request's input;
    an input of another type is left for parse() to refuse."""
    given = data.get("input")
    if isinstance(given, str | list):
        data["input"] = [*history, *_input_items(given)]


def _string(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(
            f"'{param}.{name}' must be a string.", f"{param}.{name}", GatewayErrorCode.INVALID_TYPE
        )
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array.", "tools", GatewayErrorCode.INVALID_TYPE)
    converted = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _unsupported(
                f"Only function tools are supported; built-in tools ({kind!r}) are not.",
                f"{param}.type",
            )
        function = {"name": _string(tool, "name", param)}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported(
        "'tool_choice' must be 'auto', 'none', 'required' or a function by name; built-in and "
        "allowed-tools choices are not supported.",
        "tool_choice",
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("'text' must be an object.", "text", GatewayErrorCode.INVALID_TYPE)
    if text.get("verbosity") not in (None, "medium"):
        raise invalid(
            "'text.verbosity' is not supported.",
            "text.verbosity",
            GatewayErrorCode.UNSUPPORTED_VALUE,
        )
    form = text.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(form.get("schema"), dict):
            raise invalid(
                "'text.format.schema' is required: a JSON schema object.", "text.format.schema"
            )
        schema = {"name": form.get("name") or "response", "schema": form["schema"]}
        for name in ("description", "strict"):
            if form.get(name) is not None:
                schema[name] = form[name]
        return {"type": "json_schema", "json_schema": schema}
    raise invalid(
        "'text.format.type' must be 'text', 'json_object' or 'json_schema'.", "text.format.type"
    )


def _reasoning_effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid("'reasoning' must be an object.", "reasoning", GatewayErrorCode.INVALID_TYPE)
    for name in ("summary", "generate_summary"):
        if reasoning.get(name) is not None:
            raise _unsupported(
                f"'reasoning.{name}' is not supported: a model's reasoning comes back as text, "
                "not summarised.",
                f"reasoning.{name}",
            )
    return reasoning.get("effort")


def _settings(data: dict[str, Any]) -> dict[str, Any]:
    """The request's settings a response object repeats: as sent, else the value used (the
    default OpenAI answers with), each of the type OpenAI's and Open Responses' schemas give."""
    form = (data.get("text") or {}).get("format") or {"type": "text"}
    return {
        "background": bool(data.get("background")),
        "frequency_penalty": _sent(data, "frequency_penalty", 0.0),
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "max_tool_calls": data.get("max_tool_calls"),
        "metadata": data.get("metadata") or {},
        "parallel_tool_calls": _sent(data, "parallel_tool_calls", True),
        "presence_penalty": _sent(data, "presence_penalty", 0.0),
        "previous_response_id": data.get("previous_response_id"),
        "prompt_cache_key": data.get("prompt_cache_key"),
        "reasoning": {"effort": (data.get("reasoning") or {}).get("effort"), "summary": None},
        "safety_identifier": data.get("safety_identifier"),
        # One tier serves every request (its priority comes from its key): OpenAI's "default".
        "service_tier": "default",
        "store": _sent(data, "store", True),  # OpenAI stores responses unless told not to
        "temperature": _sent(data, "temperature", 1.0),
        "text": {"format": form},
        "tool_choice": _sent(data, "tool_choice", "auto"),
        "tools": [
            {"description": None, "strict": None, "parameters": None, **tool}
            for tool in data.get("tools") or ()
        ],
        "top_logprobs": 0,  # any other number is refused
        "top_p": _sent(data, "top_p", 1.0),
        "user": data.get("user"),
    }


def _sent(data: dict[str, Any], name: str, default: Any) -> Any:
    """A setting as the request sent it, or its default where it was left out or null."""
    value = data.get(name)
    return default if value is None else value


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == CONTENT_FILTER:
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _response(
    answer: Answer,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: dict[str, Any] | None,
    *,
    status: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    incomplete = None
    if status is None:
        status, incomplete = _status(finish_reason)
    now = int(time.time())
    response = {
        "id": answer.object_id("resp_"),
        "object": "response",
        "created_at": created_at or now,
        "status": status,
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete,
        "model": answer.identity.get("model", answer.request.model),
        "output": output,
        "truncation": "disabled",
        # null until there is usage to report (response.created, a stream cut before any), as
        # OpenAI sends it and Open Responses requires it.
        "usage": _usage(usage),
        **answer.request.response_settings,
    }
    # Not nullable in OpenAI's schema, not asked for by Open Responses: left out unless sent.
    if response["user"] is None:
        del response["user"]
    return response


def snapshot(answer: Answer, status: str, error: dict[str, str] | None = None) -> dict[str, Any]:
    """The response object of a run with no output yet: queued, or failed before its start."""
    response = _response(answer, [], None, None, status=status)
    response["error"] = error
    return response


class _Items:
    """A response's output items, with the ids OpenAI gives them."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self.output: list[dict[str, Any]] = []

    def new_id(self, prefix: str) -> str:
        return f"{self._answer.object_id(prefix)}_{len(self.output)}"

    def reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        item = {
            "id": self.new_id("rs_"),
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": status,
        }
        self.output.append(item)
        return item

    def message(self, text: str, status: str = "completed") -> dict[str, Any]:
        item = {
            "id": self.new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [_output_text(text)],
        }
        self.output.append(item)
        return item

    def function_call(
        self, call_id: str, name: str, arguments: str, status: str = "completed"
    ) -> dict[str, Any]:
        item = {
            "id": self.new_id("fc_"),
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }
        self.output.append(item)
        return item


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


# The stream's last line after its terminal event, as the Open Responses specification requires
# (OpenAI's SDKs stop reading there; the event-parsers of Open Responses skip it).
_DONE = sse.encode(sse.DONE)


class ResponseEvents:
    """A streamed response's events, from the engine's chat chunks: each output item (reasoning,
    the message, each function call) opened, filled by deltas and closed in turn, between
    response.created / response.in_progress and response.completed (or .incomplete) with the
    usage, then `data: [DONE]`. Every event numbered (`sequence_number`), as OpenAI numbers
    them."""

    def __init__(self, answer: Answer, editor: StreamEditor) -> None:
        self._answer = answer
        self._editor = editor
        self._items = _Items(answer)
        self._sequence = 0
        self._created_at = int(time.time())
        self._started = False
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_kind = ""  # "reasoning", "message", or the tool call's index as text
        self._text: list[str] = []
        self._finish_reason: str | None = None
        self._failed = False
        # The response object the stream closed with: what a stored response keeps.
        self.final: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return named_event(kind, orjson.dumps(data))

    def _response(
        self, status: str, finish_reason: str | None = None, usage=None
    ) -> dict[str, Any]:
        return _response(
            self._answer,
            list(self._items.output) if status not in ("queued", "in_progress") else [],
            finish_reason,
            usage,
            status=None if status == "done" else status,
            created_at=self._created_at,
        )

    def _start(self) -> bytes:
        self._started = True
        if self._answer.request.response_settings["background"]:
            # A background response was created queued: its run starts with its first token.
            queued = self._response("queued")
            out = [
                self._event("response.created", response=queued),
                self._event("response.queued", response=queued),
            ]
        else:
            out = [self._event("response.created", response=self._response("in_progress"))]
        out.append(self._event("response.in_progress", response=self._response("in_progress")))
        return b"".join(out)

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self._started else [self._start()]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                out += self._open_item("reasoning")
                out.append(self._delta("response.reasoning_text.delta", delta["reasoning"]))
            if delta.get("content"):
                out += self._open_item("message")
                out.append(self._delta("response.output_text.delta", delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or ():
                out += self._open_item(str(call.get("index", 0)), call)
                arguments = (call.get("function") or {}).get("arguments")
                if arguments:
                    out.append(self._delta("response.function_call_arguments.delta", arguments))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _delta(self, kind: str, text: str, **fields: Any) -> bytes:
        self._text.append(text)
        item = self._open
        assert item is not None  # a delta follows the item it belongs to (_open_item)
        where = {"item_id": item["id"], "output_index": len(self._items.output)}
        if kind != "response.function_call_arguments.delta":
            where["content_index"] = 0
        return self._event(kind, **where, delta=text, **fields)

    def _open_item(self, kind: str, call: dict[str, Any] | None = None) -> list[bytes]:
        if self._open_kind == kind:
            return []
        out = self._close_item()
        index = len(self._items.output)
        self._open_kind = kind
        self._text = []
        if kind == "reasoning":
            item = {
                "id": self._items.new_id("rs_"),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
            }
        elif kind == "message":
            item = {
                "id": self._items.new_id("msg_"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        else:
            function = (call or {}).get("function") or {}
            item = {
                "id": self._items.new_id("fc_"),
                "type": "function_call",
                "call_id": (call or {}).get("id") or "",
                "name": function.get("name") or "",
                "arguments": "",
                "status": "in_progress",
            }
        self._open = item
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = _output_text("")
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        return out

    def _close_item(self, status: str = "completed") -> list[bytes]:
        item = self._open
        if item is None:
            return []
        self._open = None
        text = "".join(self._text)
        index = len(self._items.output)
        kind, out = self._open_kind, []
        self._open_kind = ""
        where = {"item_id": item["id"], "output_index": index}
        if kind == "reasoning":
            done = self._items.reasoning(text, status)
            out.append(
                self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            )
        elif kind == "message":
            done = self._items.message(text, status)
            part = done["content"][0]
            out.append(
                self._event(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
                )
            )
            out.append(
                self._event("response.content_part.done", **where, content_index=0, part=part)
            )
        else:
            done = self._items.function_call(item["call_id"], item["name"], text, status)
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=text,
                )
            )
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        return out

    def end(self, *, cut: bool) -> bytes:
        if self._failed:  # response.failed closed it
            return b""
        out = [] if self._started else [self._start()]
        finish_reason = CONTENT_FILTER if cut else self._finish_reason
        status, _ = _status(finish_reason)
        # The item open at the end was the one being written: it ends as the response does.
        out += self._close_item(status)
        response = self.final = self._response("done", finish_reason, self._editor.usage)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=response))
        out.append(_DONE)
        return b"".join(out)

    def unfinished(self, status: str, error: dict[str, str] | None = None) -> dict[str, Any]:
        """The response of a run ended without its closing events (a background run cancelled
        or failed): the items written so far, the one being written closed as incomplete."""
        output = list(self._items.output)
        if self._open is not None:
            text = "".join(self._text)
            last = _Items(self._answer)
            if self._open_kind == "reasoning":
                item = last.reasoning(text, "incomplete")
            elif self._open_kind == "message":
                item = last.message(text, "incomplete")
            else:
                item = last.function_call(
                    self._open["call_id"], self._open["name"], text, "incomplete"
                )
            output.append({**item, "id": self._open["id"]})
        response = _response(
            self._answer, output, None, self._editor.usage, status=status,
            created_at=self._created_at,
        )  # fmt: skip
        response["error"] = error
        return response

    def error(self, error: ApplicationError) -> bytes:
        """The error event, then the response failed (what was generated is in it), as OpenAI
        ends a response that fails, and the stream's end."""
        self._failed = True
        out = [] if self._started else [self._start()]
        out += self._close_item()
        out.append(
            self._event("error", code=str(error.code), message=error.message, param=error.param)
        )
        response = self.final = self._response("failed", usage=self._editor.usage)
        response["error"] = {"code": "server_error", "message": error.message}
        out.append(self._event("response.failed", response=response))
        out.append(_DONE)
        return b"".join(out)
