"""Count a request's prompt tokens with the model's tokenizer and check they fit its context."""

from __future__ import annotations

from apps.gateway.errors import GatewayErrorCode
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.models.catalog import ModelEntry
from apps.models.tokenizers import ChatTemplateError
from dmxplatform.errors import InvalidRequestError


def prompt_tokens(model: ModelEntry, request: CompletionRequest) -> int | None:
    """Return the prompt's token count (a batch's longest), or None without a tokenizer."""
    counter = model.counter
    if counter is None:
        return None
    if request.endpoint is Endpoint.CHAT:
        try:
            return counter.count_chat(request.payload["messages"])
        except ChatTemplateError as exc:
            raise InvalidRequestError(
                f"The messages do not fit the model's chat template: {exc}",
                param="messages",
                code=GatewayErrorCode.INVALID_VALUE,
            ) from exc
    return max(counter.count_prompts(request.payload["prompt"]))


def check_context(model: ModelEntry, request: CompletionRequest, tokens: int | None) -> None:
    """Raise 400 context_length_exceeded when prompt plus requested completion cannot fit."""
    if tokens is None:
        return
    limit = model.max_context_tokens
    param = "messages" if request.endpoint is Endpoint.CHAT else "prompt"
    if request.max_tokens is not None and tokens + request.max_tokens > limit:
        raise InvalidRequestError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{tokens + request.max_tokens} tokens ({tokens} in the {param}, "
            f"{request.max_tokens} in the completion). Please reduce the length of the "
            f"{param} or completion.",
            param=param,
            code=GatewayErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )
    if tokens >= limit:
        raise InvalidRequestError(
            f"This model's maximum context length is {limit} tokens. However, your {param} "
            f"resulted in {tokens} tokens. Please reduce the length of the {param}.",
            param=param,
            code=GatewayErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )
