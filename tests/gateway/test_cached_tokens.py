"""The engine's cached prompt tokens, in each API's own field: the same long prompt twice through
the running platform, the second time read from the vLLM worker's prefix cache."""

from __future__ import annotations

import uuid

import anthropic
import openai
import pytest

from inference.engine import EngineConfig

MODEL = "dmx-tiny"
# About this many tokens (the tiny tokenizer makes about one of each corpus word): several of the
# CPU engine's 128-token KV blocks (only whole blocks are cached) and a whole 512-token prefix
# group of the router's, by which the second request follows the first to its node; well inside
# the tiny model's 2,048-token context (tests.conftest.TINY_CONTEXT).
PROMPT_WORDS = 1_000
CORPUS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "explain", "how")
# vLLM's KV-cache block on a CPU (its default there): cached tokens come in whole blocks.
CPU_BLOCK_TOKENS = 128
MAX_TOKENS = 4


def long_prompt() -> str:
    """A long prompt no request sent before: its first block holds a tag of its own."""
    words = " ".join(CORPUS[i % len(CORPUS)] for i in range(PROMPT_WORDS))
    return f"{uuid.uuid4().hex} {words}"


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


@pytest.fixture
def claude(platform) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=platform.url, api_key=platform.api_key, max_retries=0)


def assert_read_from_cache(first: int, second: int, *, prompt: int, served: str = "") -> None:
    """The first sending found nothing cached; the second found whole blocks of it (`served`:
    the answer's fingerprint, which names the version, and so the node, that served it)."""
    assert first == 0, (first, served)
    assert CPU_BLOCK_TOKENS <= second < prompt, (second, prompt, served)
    assert second % CPU_BLOCK_TOKENS == 0, (second, served)


def test_the_worker_starts_vllm_counting_cached_tokens(tmp_path):
    command = EngineConfig(
        model="m", served_model_name="m", host="127.0.0.1", port=8100, run_dir=tmp_path
    ).command()
    assert "--enable-prompt-tokens-details" in command


def _chat(client: openai.OpenAI, prompt: str, *, stream: bool):
    """The answer's usage, and the version that served it (its fingerprint)."""
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        completion = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=MAX_TOKENS
        )
        return completion.usage, completion.system_fingerprint
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    return chunks[-1].usage, chunks[-1].system_fingerprint


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_reports_cached_tokens_in_prompt_tokens_details(client, stream):
    prompt = long_prompt()
    first, _ = _chat(client, prompt, stream=stream)
    second, served = _chat(client, prompt, stream=stream)
    assert second.prompt_tokens == first.prompt_tokens
    assert_read_from_cache(
        first.prompt_tokens_details.cached_tokens,
        second.prompt_tokens_details.cached_tokens,
        prompt=second.prompt_tokens,
        served=served,
    )
    # OpenAI's fields only: none of the engine's own (created_cache_tokens…).
    assert set(second.prompt_tokens_details.model_extra or {}) == set()


def _completion(client: openai.OpenAI, prompt: str, *, stream: bool):
    if not stream:
        completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)
        return completion.usage, completion.system_fingerprint
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    return chunks[-1].usage, chunks[-1].system_fingerprint


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_report_cached_tokens_in_prompt_tokens_details(client, stream):
    prompt = long_prompt()
    first, _ = _completion(client, prompt, stream=stream)
    second, served = _completion(client, prompt, stream=stream)
    assert_read_from_cache(
        first.prompt_tokens_details.cached_tokens,
        second.prompt_tokens_details.cached_tokens,
        prompt=second.prompt_tokens,
        served=served,
    )


def _response(client: openai.OpenAI, prompt: str, *, stream: bool):
    if not stream:
        return client.responses.create(model=MODEL, input=prompt, max_output_tokens=MAX_TOKENS)
    events = list(
        client.responses.create(
            model=MODEL, input=prompt, max_output_tokens=MAX_TOKENS, stream=True
        )
    )
    assert events[-1].type == "response.incomplete"  # max_output_tokens reached
    return events[-1].response


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_report_cached_tokens_in_input_tokens_details(client, stream):
    prompt = long_prompt()
    first = _response(client, prompt, stream=stream).usage
    second = _response(client, prompt, stream=stream).usage
    # OpenAI counts cached tokens in input_tokens too.
    assert second.input_tokens == first.input_tokens
    assert_read_from_cache(
        first.input_tokens_details.cached_tokens,
        second.input_tokens_details.cached_tokens,
        prompt=second.input_tokens,
    )


def _message(claude: anthropic.Anthropic, prompt: str, *, stream: bool):
    """The message's usage; streamed, as the client adds it up from message_start and
    message_delta, and message_delta's own."""
    request = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": prompt}],
    }
    if not stream:
        return claude.messages.create(**request).usage, None
    with claude.messages.stream(**request) as events:
        deltas = [event.usage for event in events if event.type == "message_delta"]
        final = events.get_final_message()
    assert len(deltas) == 1
    return final.usage, deltas[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_count_cache_reads_apart_from_input_tokens(client, claude, stream):
    prompt = long_prompt()
    first, _ = _message(claude, prompt, stream=stream)
    second, delta = _message(claude, prompt, stream=stream)
    # The whole prompt, as the engine counts it for chat completions (read from the cache by
    # now, which leaves the count as it is).
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS
    ).usage.prompt_tokens
    assert (first.input_tokens, first.cache_read_input_tokens) == (whole, 0)
    assert second.input_tokens + second.cache_read_input_tokens == whole
    assert_read_from_cache(
        first.cache_read_input_tokens,
        second.cache_read_input_tokens,
        prompt=whole,
    )
    assert second.cache_creation_input_tokens == 0
    if stream:
        assert (delta.input_tokens, delta.cache_read_input_tokens) == (
            second.input_tokens,
            second.cache_read_input_tokens,
        )
