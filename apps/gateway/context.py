"""Count a request's prompt tokens with the model's tokenizer and check they fit its context."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from apps.gateway.errors import GatewayErrorCode
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.models.catalog import ModelEntry
from apps.models.tokenizers import ChatTemplateError, prompt_chars
from dmxplatform.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int | None  # a batch's longest prompt; None without a tokenizer
    ids: list[int] | None = None  # the token ids, where the request has one text prompt
    total: int | None = None  # a batch's prompts together (None: just the one, `tokens`)
    prompts: int = 1  # how many prompts: each gets its completion

    @property
    def all_tokens(self) -> int | None:
        return self.tokens if self.total is None else self.total


def count_prompt(model: ModelEntry, request: CompletionRequest) -> PromptCount:
    """Count the prompt's tokens with the model's tokenizer, keeping the ids of a single
    prompt (routing hashes them to find the nodes that hold its prefix)."""
    counter = model.counter
    if counter is None:
        return PromptCount(None)
    if request.endpoint is Endpoint.CHAT:
        try:
            ids = counter.chat_ids(request.payload["messages"], tools=request.payload.get("tools"))
        except ChatTemplateError as exc:
            raise InvalidRequestError(
                f"The messages do not fit the model's chat template: {exc}",
                param=request.param,
                code=GatewayErrorCode.INVALID_VALUE,
            ) from exc
        return PromptCount(len(ids), ids)
    prompt_ids = counter.prompt_ids(request.prompt)
    if prompt_ids is not None:
        return PromptCount(len(prompt_ids), prompt_ids)
    counts = counter.count_prompts(request.prompt)
    return PromptCount(max(counts), total=sum(counts), prompts=len(counts))


def estimate_prompt(request: CompletionRequest, chars_per_token: int) -> PromptCount:
    """A prompt's tokens guessed from its length, for a model without a tokenizer: each prompt
    of a batch its own (token ids counted as they are)."""
    prompt = request.prompt if request.endpoint is not Endpoint.CHAT else None
    if isinstance(prompt, list) and prompt and not all(type(item) is int for item in prompt):
        counts = [
            len(item) if isinstance(item, list) else len(item) // chars_per_token + 1
            for item in prompt
        ]
        return PromptCount(max(counts), total=sum(counts), prompts=len(counts))
    if isinstance(prompt, list):
        return PromptCount(len(prompt))
    return PromptCount(_prompt_chars(request) // chars_per_token + 1)


def reservation(request: CompletionRequest, count: PromptCount, context_limit: int) -> int:
    """Tokens to hold for a request: its prompts plus the most it may generate, for every
    prompt of a batch and every choice of each."""
    completion = request.max_tokens
    if completion is None:
        completion = min(
            settings.DMX_DEFAULT_COMPLETION_RESERVE, max(context_limit - (count.tokens or 0), 0)
        )
    return (count.all_tokens or 0) + completion * request.n * count.prompts


def _prompt_chars(request: CompletionRequest) -> int:
    """The prompt's characters (a batch's longest text; token ids are counted exactly, and
    cheaply, by prompt_tokens)."""
    if request.endpoint is Endpoint.CHAT:
        return sum(prompt_chars(message.get("content")) for message in request.payload["messages"])
    prompt = request.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return max((len(item) for item in prompt if isinstance(item, str)), default=0)


def check_context_bound(model: ModelEntry, request: CompletionRequest, limit: int) -> None:
    """Refuse, before any tokenizing, a prompt too long to fit however it tokenizes: its length
    over the tokenizer's longest token is already more than the context allows.

    The bound is loose (real text takes three to five characters a token, the longest tokens
    ten or more), so a normaliser that composes characters cannot make it refuse a prompt that
    would have fit; what it buys is that a prompt of megabytes costs microseconds, not seconds
    of tokenizer time and its memory."""
    counter = model.counter
    if counter is not None:
        _check(model, request, counter.min_tokens(_prompt_chars(request)), limit, at_least=True)


def check_context(
    model: ModelEntry, request: CompletionRequest, tokens: int | None, limit: int
) -> None:
    """Raise 400 context_length_exceeded when prompt plus requested completion cannot fit."""
    if tokens is not None:
        _check(model, request, tokens, limit, at_least=False)


def _check(
    model: ModelEntry, request: CompletionRequest, tokens: int, limit: int, *, at_least: bool
) -> None:
    param = request.param
    maximum = f"This model's maximum context length is {limit} tokens"
    if limit < model.max_context_tokens:
        maximum += f" while it is under load (normally {model.max_context_tokens})"
    some = "at least " if at_least else ""
    count = f"{some}{tokens}"
    if request.max_tokens is not None and tokens + request.max_tokens > limit:
        total = f"{some}{tokens + request.max_tokens}"
        raise InvalidRequestError(
            f"{maximum}. However, you requested {total} tokens ({count} in the {param}, "
            f"{request.max_tokens} in the completion). Please reduce the length of the {param} "
            "or completion.",
            param=param,
            code=GatewayErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )
    if tokens >= limit:
        raise InvalidRequestError(
            f"{maximum}. However, your {param} resulted in {count} tokens. Please reduce the "
            f"length of the {param}.",
            param=param,
            code=GatewayErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )
