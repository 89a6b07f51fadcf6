"""Validate /v1 request bodies the way OpenAI does, and say which parameter is wrong.

Hand-written checks over the decoded JSON: a few microseconds per request, and exact messages.
Only what the gateway itself relies on, or what is cheap to reject before any GPU work, is
checked here; every other field passes through to vLLM, which validates it in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from apps.gateway.errors import GatewayErrorCode
from dmxplatform.errors import InvalidRequestError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_N = 128  # vLLM's own ceiling for parallel samples


class Endpoint(StrEnum):
    CHAT = "chat.completions"
    COMPLETIONS = "completions"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self is Endpoint.CHAT else "/v1/completions"


@dataclass(slots=True)
class CompletionRequest:
    endpoint: Endpoint
    model: str
    payload: dict[str, Any]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int

    @property
    def prompt(self) -> Any:
        return (
            self.payload["messages"] if self.endpoint is Endpoint.CHAT else self.payload["prompt"]
        )


def _invalid(message: str, param: str | None, code: GatewayErrorCode) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def parse_json(body: bytes) -> dict[str, Any]:
    """Decode a JSON object body, or raise a 400."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _invalid(
            "We could not parse the JSON body of your request. The body must be valid JSON.",
            None,
            GatewayErrorCode.INVALID_JSON,
        ) from None
    if not isinstance(data, dict):
        raise _invalid(
            "The request body must be a JSON object.", None, GatewayErrorCode.INVALID_TYPE
        )
    return data


def _optional_int(
    data: dict[str, Any], name: str, minimum: int, maximum: int | None = None
) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"'{name}' must be an integer.", name, GatewayErrorCode.INVALID_TYPE)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise _invalid(
            f"'{name}' must be {bound}, got {value}.", name, GatewayErrorCode.INVALID_VALUE
        )
    return value


def _optional_number(data: dict[str, Any], name: str, minimum: float, maximum: float) -> None:
    value = data.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(f"'{name}' must be a number.", name, GatewayErrorCode.INVALID_TYPE)
    if not minimum <= value <= maximum:
        raise _invalid(
            f"'{name}' must be between {minimum} and {maximum}, got {value}.",
            name,
            GatewayErrorCode.INVALID_VALUE,
        )


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise _invalid("'messages' is required.", "messages", GatewayErrorCode.MISSING_PARAMETER)
    if not isinstance(messages, list) or not messages:
        raise _invalid(
            "'messages' must be a non-empty array.", "messages", GatewayErrorCode.INVALID_TYPE
        )
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid(f"'{param}' must be an object.", param, GatewayErrorCode.INVALID_TYPE)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise _invalid(
                f"'{param}.role' must be one of {', '.join(sorted(CHAT_ROLES))}.",
                f"{param}.role",
                GatewayErrorCode.INVALID_VALUE,
            )
        content = message.get("content")
        # An assistant message may carry tool calls instead of content.
        if content is None and role == "assistant":
            continue
        if not isinstance(content, str | list):
            raise _invalid(
                f"'{param}.content' must be a string or an array of content parts.",
                f"{param}.content",
                GatewayErrorCode.INVALID_TYPE,
            )


def _check_prompt(prompt: Any) -> None:
    if prompt is None:
        raise _invalid("'prompt' is required.", "prompt", GatewayErrorCode.MISSING_PARAMETER)
    if isinstance(prompt, str):
        return
    valid = (
        isinstance(prompt, list)
        and prompt
        and (
            all(isinstance(item, str) for item in prompt)
            or all(isinstance(item, int) and not isinstance(item, bool) for item in prompt)
            or all(
                isinstance(item, list) and item and all(isinstance(t, int) for t in item)
                for item in prompt
            )
        )
    )
    if not valid:
        raise _invalid(
            "'prompt' must be a string, an array of strings, an array of token ids, "
            "or an array of token-id arrays.",
            "prompt",
            GatewayErrorCode.INVALID_TYPE,
        )


def validate_completion(endpoint: Endpoint, data: dict[str, Any]) -> CompletionRequest:
    """Check a chat or text completion request; return what the pipeline needs from it."""
    model = data.get("model")
    if model is None:
        raise _invalid("'model' is required.", "model", GatewayErrorCode.MISSING_PARAMETER)
    if not isinstance(model, str) or not model:
        raise _invalid(
            "'model' must be a non-empty string.", "model", GatewayErrorCode.INVALID_TYPE
        )
    if endpoint is Endpoint.CHAT:
        _check_messages(data.get("messages"))
        max_tokens = _optional_int(data, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _optional_int(data, "max_tokens", 1)
    else:
        _check_prompt(data.get("prompt"))
        max_tokens = _optional_int(data, "max_tokens", 0)
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _invalid("'stream' must be a boolean.", "stream", GatewayErrorCode.INVALID_TYPE)
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _invalid(
                "'stream_options' is only allowed when 'stream' is true.",
                "stream_options",
                GatewayErrorCode.INVALID_VALUE,
            )
        if not isinstance(options, dict):
            raise _invalid(
                "'stream_options' must be an object.",
                "stream_options",
                GatewayErrorCode.INVALID_TYPE,
            )
        include_usage = bool(options.get("include_usage", False))
    n = _optional_int(data, "n", 1, MAX_N) or 1
    _optional_number(data, "temperature", 0.0, 2.0)
    _optional_number(data, "top_p", 0.0, 1.0)
    return CompletionRequest(
        endpoint=endpoint,
        model=model,
        payload=data,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        n=n,
    )
