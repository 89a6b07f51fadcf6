"""OpenAI's chat completions, completions and embeddings: the engine's own APIs, passed through."""

from __future__ import annotations

from typing import Any

import orjson

from apps.gateway import sse
from apps.gateway.dialects.base import Answer
from apps.gateway.outputs import StreamEditor
from apps.gateway.schemas import (
    CompletionRequest,
    Endpoint,
    validate_completion,
    validate_embeddings,
)
from dmxplatform.errors import ApplicationError


class OpenAIDialect:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def parse(self, data: dict[str, Any]) -> CompletionRequest:
        if self.endpoint is Endpoint.EMBEDDINGS:
            return validate_embeddings(data)
        return validate_completion(self.endpoint, data)

    def error_body(self, error: ApplicationError) -> bytes:
        return error.to_json()

    def answer(
        self, completion: dict[str, Any], answer: Answer, stop: str | None
    ) -> dict[str, Any]:
        return completion

    def writer(self, answer: Answer, editor: StreamEditor) -> ChunkWriter:
        return ChunkWriter(answer.request.include_usage, editor)


class ChunkWriter:
    """Chunks as they are, `data: [DONE]` at the end; a stream the gateway cuts short gets its
    usage chunk (where asked for) from what was generated."""

    final: dict[str, Any] | None = None  # nothing of these answers is stored

    __slots__ = ("_editor", "_include_usage")

    def __init__(self, include_usage: bool, editor: StreamEditor) -> None:
        self._include_usage = include_usage
        self._editor = editor

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        return sse.encode(orjson.dumps(chunk))

    def end(self, *, cut: bool) -> bytes:
        done = sse.encode(sse.DONE)
        if cut and self._include_usage and self._editor.usage:
            return self.chunk(self._editor.usage_chunk()) + done
        return done

    def error(self, error: ApplicationError) -> bytes:
        return sse.encode(error.to_json())
