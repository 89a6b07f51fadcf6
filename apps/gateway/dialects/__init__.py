"""The APIs clients speak, over the one the engine is asked in.

Chat completions, completions and embeddings go to vLLM as they came. OpenAI's Responses API
and Anthropic's Messages API are translated into chat completions on the way in and back into
their own objects and events on the way out, so that every request runs the same pipeline:
the same limits, content filter (on streamed output too), context check, routing, and billing
to the token from the engine's per-chunk usage, also for a stream a client leaves (vLLM's own
/v1/responses and /v1/messages report usage only at the end).

A dialect parses a request body into the engine's request, renders errors in its API's shape,
and turns the engine's (shaped, filtered) answer or chunks into its own.
"""

from __future__ import annotations

from apps.gateway.dialects.base import Dialect
from apps.gateway.dialects.messages import MessagesDialect
from apps.gateway.dialects.openai import OpenAIDialect
from apps.gateway.dialects.responses import ResponsesDialect
from apps.gateway.schemas import Endpoint

_DIALECTS: dict[Endpoint, Dialect] = {
    Endpoint.CHAT: OpenAIDialect(Endpoint.CHAT),
    Endpoint.COMPLETIONS: OpenAIDialect(Endpoint.COMPLETIONS),
    Endpoint.EMBEDDINGS: OpenAIDialect(Endpoint.EMBEDDINGS),
    Endpoint.RESPONSES: ResponsesDialect(),
    Endpoint.MESSAGES: MessagesDialect(),
}


def dialect_for(endpoint: Endpoint) -> Dialect:
    return _DIALECTS[endpoint]
