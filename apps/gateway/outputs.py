"""What vLLM returns, made into what the client gets: content through the filter, usage the
way OpenAI reports it, and the token counts the gateway bills."""

from __future__ import annotations

from typing import Any

import orjson

from apps.gateway.content_filter import ContentFilter, FilterAction, Match, StreamScanner, mask_text
from apps.gateway.schemas import Endpoint

CONTENT_FILTER = "content_filter"


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

    def __init__(self, content_filter: ContentFilter, *, endpoint: Endpoint, include_usage: bool):
        self._filter = content_filter
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
        if not self._identity:
            self._identity = {
                k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk
            }
        usage = chunk.pop("usage", None)
        choices = chunk.get("choices")
        if not choices:
            if usage is None:
                return None
            self._final_usage = usage
            if not self._include_usage:
                return None
            chunk["usage"] = usage
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
        return orjson.dumps({**self._identity, "choices": [], "usage": self.usage})

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


def filter_response(
    body: bytes, content_filter: ContentFilter, *, endpoint: Endpoint
) -> tuple[bytes, dict[str, Any] | None, list[str], bool]:
    """Filter a whole (non-streamed) completion; return the body, usage, flags, blocked."""
    response = orjson.loads(body)
    usage = response.get("usage")
    if not len(content_filter):
        return body, usage, [], False
    flags: set[str] = set()
    blocked = changed = False
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
            changed = True
    if changed or blocked:
        body = orjson.dumps(response)
    return body, usage, sorted(flags), blocked
