"""The prompt's text: screened by the content filter, classified for intent."""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings

from apps.gateway.content_filter import ContentFilter, FilterAction
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.intent import user_request
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.models.tokenizers import message_text
from dmxplatform.errors import InvalidRequestError


def intent_text(request: CompletionRequest) -> str:
    """The text that says what the user wants: the last user message (after the one it refers
    back to, if it only does that), or the prompt."""
    if request.endpoint is Endpoint.CHAT:
        return user_request(request.payload["messages"], message_text)
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    return prompt[0] if prompt and isinstance(prompt[0], str) else ""


def _texts(request: CompletionRequest) -> list[tuple[dict[str, Any] | list, Any, str]]:
    """Every (container, slot, text) of the prompt, so masked text can be written back."""
    found: list[tuple[Any, str | int, str]] = []
    if request.endpoint is Endpoint.CHAT:
        for message in request.payload["messages"]:
            content = message.get("content")
            if isinstance(content, str):
                found.append((message, "content", content))
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        found.append((part, "text", part["text"]))
            # The arguments of the calls an assistant turn made: text the model reads too.
            for call in message.get("tool_calls") or ():
                function = call.get("function")
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    found.append((function, "arguments", function["arguments"]))
    else:
        prompt = request.prompt
        if isinstance(prompt, str):
            found.append((request.payload, request.prompt_param, prompt))
        elif prompt and isinstance(prompt[0], str):
            found.extend((prompt, i, text) for i, text in enumerate(prompt))
    return found


def screen_prompt(content_filter: ContentFilter, request: CompletionRequest) -> list[str]:
    """Refuse a prompt with a blocked term (before any GPU work), mask masked terms in place,
    and return the flagged terms."""
    if not len(content_filter):
        return []
    flags: set[str] = set()
    param = request.param
    for container, slot, text in _texts(request):
        matches = content_filter.scan(text)
        if not matches:
            continue
        blocked = next((m for m in matches if m.action is FilterAction.BLOCK), None)
        if blocked is not None:
            raise InvalidRequestError(
                f"Your request was rejected by the content policy (category: {blocked.category}).",
                param=param,
                code=GatewayErrorCode.CONTENT_POLICY_VIOLATION,
            )
        flags.update(m.term for m in matches if m.action is FilterAction.FLAG)
        if any(m.action is FilterAction.MASK for m in matches):
            container[slot] = content_filter.mask(text)
    return sorted(flags)


def affinity_key(request: CompletionRequest) -> int | None:
    """A 64-bit key of the prompt's shared start: requests that share it share vLLM's prefix
    cache when they land on the same node, so the router keeps them together.

    For chat, the leading system (or developer) messages: what a product's requests have in
    common; without them, the first message's start. For text, the prompt's start.
    """
    limit = settings.DMX_ROUTE_AFFINITY_PREFIX_CHARS
    if request.endpoint is Endpoint.CHAT:
        messages = request.payload["messages"]
        leading = []
        for message in messages:
            if message.get("role") not in ("system", "developer"):
                break
            leading.append(message_text(message.get("content")))
        prefix = "\x1e".join(leading) if leading else message_text(messages[0].get("content"))
    else:
        prompt = request.prompt
        prefix = prompt if isinstance(prompt, str) else ""
    if not prefix:
        return None
    return int.from_bytes(hashlib.blake2b(prefix[:limit].encode(), digest_size=8).digest(), "big")
