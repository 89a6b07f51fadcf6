"""The context a request may use: the model's, less while its fleet runs short of KV cache."""

import pytest

from apps.gateway.context import check_context, check_context_bound
from apps.gateway.schemas import Endpoint, validate_completion
from apps.routing.dispatcher import context_limit
from dmxplatform.errors import InvalidRequestError
from tests.routing.factories import make_fleet, make_model_entry, make_snapshot

MODEL = make_model_entry(max_context_tokens=1000)


def fleet(*usages: float) -> float | None:
    """The KV-cache pressure routing reports for a fleet of nodes at these usages."""
    nodes = (make_snapshot(max_model_len=1000, kv_cache_usage=u) for u in usages)
    return make_fleet(*nodes).kv_pressure(MODEL.name)


def test_full_context_below_the_watermark():
    assert context_limit(MODEL, fleet(0.5, 0.95)) == 1000  # mean 0.725
    assert context_limit(MODEL, fleet()) == 1000  # no live node: routing will answer 503


def test_reduced_context_above_the_watermark(settings):
    settings.DMX_CONTEXT_WATERMARK = 0.9
    settings.DMX_CONTEXT_PRESSURE_FACTOR = 0.5
    assert context_limit(MODEL, fleet(0.92, 0.96)) == 500


def request(max_tokens=None):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return validate_completion(Endpoint.CHAT, body)


def test_check_context_names_the_reduced_limit():
    check_context(MODEL, request(), 499, 500)
    with pytest.raises(InvalidRequestError) as error:
        check_context(MODEL, request(), 500, 500)
    assert error.value.code == "context_length_exceeded"
    assert "500 tokens while it is under load (normally 1000)" in error.value.message
    with pytest.raises(InvalidRequestError):
        check_context(MODEL, request(max_tokens=200), 400, 500)
    check_context(MODEL, request(max_tokens=100), 400, 500)


class RefusingCounter:
    """A tokenizer that must not be asked: the bound alone decides."""

    longest_token_chars = 10

    def min_tokens(self, chars: int) -> int:
        return -(-chars // self.longest_token_chars)

    def count_chat(self, messages):
        raise AssertionError("tokenized a prompt the bound refuses")


def test_a_prompt_too_long_for_any_tokenization_is_refused_without_tokenizing():
    model = make_model_entry(max_context_tokens=1000, counter=RefusingCounter())
    fits_by_bound = validate_completion(
        Endpoint.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 9990}]}
    )
    check_context_bound(model, fits_by_bound, 1000)  # 999 tokens at least: may fit
    huge = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s" * 6000},
            {"role": "user", "content": [{"type": "text", "text": "u" * 4000}]},
        ],
    }
    with pytest.raises(InvalidRequestError) as error:
        check_context_bound(model, validate_completion(Endpoint.CHAT, huge), 1000)
    assert error.value.code == "context_length_exceeded"
    assert "at least 1000 tokens" in error.value.message
    with_completion = {**huge, "messages": huge["messages"][:1], "max_tokens": 500}
    with pytest.raises(InvalidRequestError) as error:
        check_context_bound(model, validate_completion(Endpoint.CHAT, with_completion), 1000)
    assert "at least 1100 tokens (at least 600 in the messages, 500 in the completion)" in (
        error.value.message
    )


def test_the_bound_reads_the_longest_prompt_of_a_batch():
    model = make_model_entry(max_context_tokens=100, counter=RefusingCounter())
    batch = validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": ["a", "b" * 1000]})
    with pytest.raises(InvalidRequestError):
        check_context_bound(model, batch, 100)
    ids = validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": list(range(99))})
    check_context_bound(model, ids, 100)


def test_without_a_tokenizer_a_batch_is_estimated_prompt_by_prompt():
    from apps.gateway.context import estimate_prompt
    from apps.gateway.schemas import validate_embeddings

    request = validate_embeddings({"model": "m", "input": ["a" * 400, "b" * 40, "c"]})
    count = estimate_prompt(request, 4)
    assert (count.tokens, count.total, count.prompts) == (101, 101 + 11 + 1, 3)
    ids = validate_embeddings({"model": "m", "input": [[1, 2, 3], [4]]})
    assert estimate_prompt(ids, 4).total == 4
