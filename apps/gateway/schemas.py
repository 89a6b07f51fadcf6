"""Validate /v1 request bodies the way OpenAI does, and say which parameter is wrong.

Hand-written checks over the decoded JSON: a few microseconds per request, and exact messages.
Only what the gateway itself relies on, or what is cheap to reject before any GPU work, is
checked here; every other field passes through to vLLM, which validates it in turn, except the
fields of OpenAI's API that no engine here honours: those are refused by name, never dropped in
silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from apps.gateway.errors import GatewayErrorCode
from dmxplatform.errors import InvalidRequestError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_N = 128  # vLLM's own ceiling for parallel samples
# Nesting allowed in a body: deeper than any real request (a tool's JSON schema nests a level
# per object and its `properties`), and well inside the 254 levels orjson re-encodes for the
# engine; a deeper body used to pass parsing and fail there with a 500.
MAX_JSON_DEPTH = 64

# Fields of OpenAI's API that vLLM accepts and ignores (or does not know), refused whatever
# their value. reasoning_effort and parallel_tool_calls are not here: vLLM honours them.
_REFUSED_FIELDS = {
    "functions": "The legacy 'functions' parameter is not supported; use 'tools'.",
    "function_call": "The legacy 'function_call' parameter is not supported; use 'tool_choice'.",
    "prediction": "Predicted outputs ('prediction') are not supported.",
    "audio": "Audio output ('audio') is not supported.",
    "web_search_options": "Built-in web search ('web_search_options') is not supported.",
}
# service_tier values that ask for nothing beyond what every request gets.
_DEFAULT_SERVICE_TIERS = frozenset({"auto", "default"})


class Endpoint(StrEnum):
    """A /v1 API, as the usage record names it. Responses and Messages requests go to the
    engine as chat completions (apps.gateway.dialects translates them both ways)."""

    CHAT = "chat.completions"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        """Where the gateway serves it (and vLLM, for the engine's own APIs)."""
        return "/v1/" + self.value.replace(".", "/")


_PROMPT_PARAMS = {Endpoint.CHAT: "messages", Endpoint.EMBEDDINGS: "input"}


@dataclass(slots=True)
class CompletionRequest:
    """A request as the engine gets it: `endpoint` is the engine's API (chat completions,
    completions or embeddings) and `payload` its body, translated where the client spoke
    another API."""

    endpoint: Endpoint
    model: str
    payload: dict[str, Any]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    # The client's name for the prompt's field, for errors about it ("input" for a Responses
    # request the engine gets as chat "messages"); empty: the payload's own.
    client_prompt_param: str = ""
    # The request's settings a Responses object repeats (apps.gateway.dialects.responses).
    response_settings: dict[str, Any] = field(default_factory=dict)
    # A stored response's input items (the conversation so far, then the request's own).
    response_input: list[dict[str, Any]] = field(default_factory=list)

    @property
    def prompt_param(self) -> str:
        """The payload's field that holds the prompt."""
        return _PROMPT_PARAMS.get(self.endpoint, "prompt")

    @property
    def param(self) -> str:
        """The prompt's field as the client named it."""
        return self.client_prompt_param or self.prompt_param

    @property
    def prompt(self) -> Any:
        return self.payload[self.prompt_param]


def invalid(
    message: str, param: str | None, code: str = GatewayErrorCode.INVALID_VALUE
) -> InvalidRequestError:
    """A 400 naming the parameter at fault."""
    return InvalidRequestError(message, param=param, code=code)


def parse_json(body: bytes) -> dict[str, Any]:
    """Decode a JSON object body nested at most MAX_JSON_DEPTH levels, or raise a 400."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise invalid(
            "We could not parse the JSON body of your request. The body must be valid JSON.",
            None,
            GatewayErrorCode.INVALID_JSON,
        ) from None
    if not isinstance(data, dict):
        raise invalid(
            "The request body must be a JSON object.", None, GatewayErrorCode.INVALID_TYPE
        )
    # Nesting needs brackets: a body with few of them (nearly all) is not walked at all.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _deeper_than(data, MAX_JSON_DEPTH):
        raise invalid(
            f"The JSON body is nested deeper than {MAX_JSON_DEPTH} levels.",
            None,
            GatewayErrorCode.INVALID_JSON,
        )
    return data


def _deeper_than(data: dict[str, Any], limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def optional_int(
    data: dict[str, Any], name: str, minimum: int, maximum: int | None = None
) -> int | None:
    """Return the body's integer `name` (None if absent), or raise a 400 naming it."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer.", name, GatewayErrorCode.INVALID_TYPE)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise invalid(
            f"'{name}' must be {bound}, got {value}.", name, GatewayErrorCode.INVALID_VALUE
        )
    return value


def optional_number(data: dict[str, Any], name: str, minimum: float, maximum: float) -> None:
    """Check the body's number `name`, if there is one, or raise a 400 naming it."""
    value = data.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"'{name}' must be a number.", name, GatewayErrorCode.INVALID_TYPE)
    if not minimum <= value <= maximum:
        raise invalid(
            f"'{name}' must be between {minimum} and {maximum}, got {value}.",
            name,
            GatewayErrorCode.INVALID_VALUE,
        )


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise invalid("'messages' is required.", "messages", GatewayErrorCode.MISSING_PARAMETER)
    if not isinstance(messages, list) or not messages:
        raise invalid(
            "'messages' must be a non-empty array.", "messages", GatewayErrorCode.INVALID_TYPE
        )
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(f"'{param}' must be an object.", param, GatewayErrorCode.INVALID_TYPE)
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise invalid(
                f"'{param}.role' must be one of {', '.join(sorted(CHAT_ROLES))}.",
                f"{param}.role",
                GatewayErrorCode.INVALID_VALUE,
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not (
            isinstance(tool_calls, list) and all(isinstance(call, dict) for call in tool_calls)
        ):
            raise invalid(
                f"'{param}.tool_calls' must be an array of objects.",
                f"{param}.tool_calls",
                GatewayErrorCode.INVALID_TYPE,
            )
        content = message.get("content")
        # An assistant message may carry tool calls instead of content.
        if content is None and role == "assistant":
            continue
        if isinstance(content, list):
            _check_content_parts(content, f"{param}.content")
        elif not isinstance(content, str):
            raise invalid(
                f"'{param}.content' must be a string or an array of content parts.",
                f"{param}.content",
                GatewayErrorCode.INVALID_TYPE,
            )


def _check_content_parts(parts: list[Any], param: str) -> None:
    """Each part an object with a string `type`, and text where a part has text: the gateway
    reads it (screening, intent, the token count)."""
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise invalid(
                f"'{where}' must be an object with a string 'type'.",
                where,
                GatewayErrorCode.INVALID_TYPE,
            )
        if (part["type"] == "text" or "text" in part) and not isinstance(part.get("text"), str):
            raise invalid(
                f"'{where}.text' must be a string.", f"{where}.text", GatewayErrorCode.INVALID_TYPE
            )


def _check_prompt(prompt: Any, name: str = "prompt") -> None:
    if prompt is None:
        raise invalid(f"'{name}' is required.", name, GatewayErrorCode.MISSING_PARAMETER)
    if isinstance(prompt, str):
        return
    valid = (
        isinstance(prompt, list)
        and prompt
        and (
            all(isinstance(item, str) for item in prompt)
            or _token_ids(prompt)
            or all(isinstance(item, list) and item and _token_ids(item) for item in prompt)
        )
    )
    if not valid:
        raise invalid(
            f"'{name}' must be a string, an array of strings, an array of token ids, "
            "or an array of token-id arrays.",
            name,
            GatewayErrorCode.INVALID_TYPE,
        )


def _token_ids(items: list[Any]) -> bool:
    # bool is an int to Python, not a token id to anyone.
    return all(type(item) is int and item >= 0 for item in items)


def _refuse_unhonoured(data: dict[str, Any]) -> None:
    """Refuse, naming it, a field of OpenAI's API that would be accepted and ignored."""
    for name, message in _REFUSED_FIELDS.items():
        if data.get(name) is not None:
            raise invalid(message, name, GatewayErrorCode.UNSUPPORTED_PARAMETER)
    if data.get("store"):
        raise invalid(
            "Stored completions ('store': true) are not supported.",
            "store",
            GatewayErrorCode.UNSUPPORTED_VALUE,
        )
    if data.get("metadata"):
        raise invalid(
            "'metadata' is kept only with stored completions, which are not supported.",
            "metadata",
            GatewayErrorCode.UNSUPPORTED_PARAMETER,
        )
    tier = data.get("service_tier")
    if tier is not None and not (isinstance(tier, str) and tier in _DEFAULT_SERVICE_TIERS):
        raise invalid(
            "'service_tier' may only be 'auto' or 'default': a request's priority comes from "
            "its API key.",
            "service_tier",
            GatewayErrorCode.UNSUPPORTED_VALUE,
        )
    modalities = data.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid(
            "Only text output is supported: 'modalities' must be [\"text\"].",
            "modalities",
            GatewayErrorCode.UNSUPPORTED_VALUE,
        )


def check_model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if model is None:
        raise invalid("'model' is required.", "model", GatewayErrorCode.MISSING_PARAMETER)
    if not isinstance(model, str) or not model:
        raise invalid("'model' must be a non-empty string.", "model", GatewayErrorCode.INVALID_TYPE)
    return model


# OpenAI's own bound on an embeddings request's inputs.
MAX_EMBEDDING_INPUTS = 2048
_ENCODING_FORMATS = frozenset({"float", "base64"})


def validate_embeddings(data: dict[str, Any]) -> CompletionRequest:
    """Check an embeddings request: its inputs as a completions prompt may be, none empty."""
    model = check_model(data)
    inputs = data.get("input")
    _check_prompt(inputs, "input")
    if inputs == "" or (isinstance(inputs, list) and any(item in ("", []) for item in inputs)):
        raise invalid(
            "'input' must not contain empty strings.", "input", GatewayErrorCode.INVALID_VALUE
        )
    if isinstance(inputs, list) and len(inputs) > MAX_EMBEDDING_INPUTS and not _token_ids(inputs):
        raise invalid(
            f"'input' may hold at most {MAX_EMBEDDING_INPUTS} inputs, got {len(inputs)}.",
            "input",
            GatewayErrorCode.INVALID_VALUE,
        )
    encoding = data.get("encoding_format")
    if encoding is not None and not (isinstance(encoding, str) and encoding in _ENCODING_FORMATS):
        raise invalid(
            "'encoding_format' must be 'float' or 'base64'.",
            "encoding_format",
            GatewayErrorCode.INVALID_VALUE,
        )
    optional_int(data, "dimensions", 1)
    return CompletionRequest(
        endpoint=Endpoint.EMBEDDINGS,
        model=model,
        payload=data,
        stream=False,
        include_usage=False,
        max_tokens=0,
        n=1,
    )


def _strict_when_forced(data: dict[str, Any]) -> None:
    """Mark the tools a call is forced to (a named `tool_choice`, or `required`) strict.

    A forced call must be one the client can parse: OpenAI's clients `JSON.parse` the arguments
    of the schema's object, Anthropic's promise an object `input`. vLLM constrains a forced
    call's envelope, and its arguments only where the tool is strict (`--tool-strict-level`
    auto): a random-weight model then answered `"true"` or `-Infinity`. A client's own
    `strict` (false too) is left as it sent it."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if not isinstance(tools, list):
        return
    if choice == "required":
        forced = None  # any of them
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
    else:
        return
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or "strict" in function:
            continue
        if forced is None or function.get("name") == forced:
            tool["function"] = {**function, "strict": True}


def validate_completion(endpoint: Endpoint, data: dict[str, Any]) -> CompletionRequest:
    """Check a chat or text completion request; return what the pipeline needs from it."""
    model = check_model(data)
    _refuse_unhonoured(data)
    if endpoint is Endpoint.CHAT:
        _check_messages(data.get("messages"))
        _strict_when_forced(data)
        max_tokens = optional_int(data, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = optional_int(data, "max_tokens", 1)
    else:
        _check_prompt(data.get("prompt"))
        max_tokens = optional_int(data, "max_tokens", 0)
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean.", "stream", GatewayErrorCode.INVALID_TYPE)
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise invalid(
                "'stream_options' is only allowed when 'stream' is true.",
                "stream_options",
                GatewayErrorCode.INVALID_VALUE,
            )
        if not isinstance(options, dict):
            raise invalid(
                "'stream_options' must be an object.",
                "stream_options",
                GatewayErrorCode.INVALID_TYPE,
            )
        include_usage = bool(options.get("include_usage", False))
    n = optional_int(data, "n", 1, MAX_N) or 1
    optional_number(data, "temperature", 0.0, 2.0)
    optional_number(data, "top_p", 0.0, 1.0)
    return CompletionRequest(
        endpoint=endpoint,
        model=model,
        payload=data,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        n=n,
    )
