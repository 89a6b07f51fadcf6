"""The official OpenAI client against the running platform: every call a real vLLM round trip."""

from __future__ import annotations

import time

import openai
import pytest

from apps.billing.models import UsageRecord
from tests.stack import DRAIN_TIMEOUT, wait_for

MODEL = "dmx-tiny"


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


def usage_row(request_id: str) -> UsageRecord:
    """Wait for Celery to flush the request's usage record into PostgreSQL."""
    return wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=DRAIN_TIMEOUT,
        what=f"usage record {request_id}",
    )


def test_chat_completion_is_served_and_its_usage_recorded(client, committed):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=12,
        extra_body={"ignore_eos": True},  # vLLM: generate exactly max_tokens
    )
    completion = raw.parse()
    request_id = raw.headers["x-request-id"]

    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens > 0

    record = usage_row(request_id)
    assert record.status == "ok"
    assert record.endpoint == "chat.completions"
    assert (record.prompt_tokens, record.completion_tokens) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )
    assert record.model == MODEL and record.model_version in ("v1", "v2")
    assert record.node.startswith("test-dmx-tiny-")
    assert record.stream is False
    # Every stage the request went through (jsonb keeps no order), adding up to no more than
    # its duration.
    assert set(record.timings) == {
        "auth", "parse", "intent", "screen", "context", "limits", "route", "connect", "generate",
        "settle",
    }  # fmt: skip
    assert record.timings["generate"] > 0
    assert sum(record.timings.values()) <= record.duration_ms


def test_streamed_chat_arrives_chunk_by_chunk_then_usage(client, committed):
    after_first = ("decode", "settle")
    arrivals = []
    chunks = []
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in raw.parse():
        arrivals.append(time.perf_counter())
        chunks.append(chunk)

    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == 40
    content_chunks = [c for c in chunks[:-1] if c.choices]
    # vLLM sends the role first, then a chunk per token; under load it merges tokens that
    # waited for the same write, so "per token" is an upper bound.
    assert 2 <= len(content_chunks) <= 1 + 40
    assert content_chunks[-1].choices[0].finish_reason == "length"
    # Chunks were relayed as they were generated, not buffered into one write: they came in
    # several separate deliveries. (How far apart is the engine's business: the tiny model can
    # produce all 40 tokens within a few milliseconds.)
    spread = arrivals[-2] - arrivals[0]
    deliveries = len({round(t, 3) for t in arrivals})
    assert deliveries >= 3, (spread, deliveries, len(content_chunks))

    record = usage_row(raw.headers["x-request-id"])
    assert record.stream is True
    assert (record.prompt_tokens, record.completion_tokens) == (
        usage_chunk.usage.prompt_tokens,
        usage_chunk.usage.completion_tokens,
    )
    assert record.time_to_first_token_ms is not None
    assert 0 < record.time_to_first_token_ms <= record.duration_ms
    assert {"connect", "ttft", "decode", "settle"} <= set(record.timings)
    assert "generate" not in record.timings
    # The stages up to the first token are the time to it.
    before_first = sum(ms for stage, ms in record.timings.items() if stage not in after_first)
    assert abs(before_first - record.time_to_first_token_ms) < 1.0


def test_stream_without_include_usage_gets_no_usage_chunk_but_is_still_recorded(client, committed):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(raw.parse())
    assert all(chunk.choices for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)
    record = usage_row(raw.headers["x-request-id"])
    assert record.completion_tokens == 5


def test_text_completion(client, committed):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time", max_tokens=7, extra_body={"ignore_eos": True}
    )
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.usage.completion_tokens == 7
    record = usage_row(raw.headers["x-request-id"])
    assert record.endpoint == "completions"
    assert record.prompt_tokens == completion.usage.prompt_tokens


def test_models_lists_served_models_only(client):
    ids = {model.id for model in client.models.list()}
    assert "dmx-tiny" in ids
    assert "dmx-unserved" not in ids  # in the catalog, but no node serves it
    assert client.models.retrieve(MODEL).id == MODEL


def test_models_say_each_models_kind_and_context_length(client, committed):
    from apps.models.models import LlmModel

    model = client.models.retrieve(MODEL)
    registered = LlmModel.objects.get(name=MODEL)
    assert (model.kind, model.max_model_len) == ("generate", registered.max_context_tokens)


# What vLLM 0.32 adds to OpenAI's objects, which no answer of the platform may carry.
ENGINE_FIELDS = {
    "kv_transfer_params", "prompt_token_ids", "prompt_logprobs", "prompt_text", "token_ids",
    "routed_experts", "ec_transfer_params", "metrics", "stop_reason",
}  # fmt: skip


def engine_fields_in(obj) -> set[str]:
    if isinstance(obj, dict):
        return (set(obj) & ENGINE_FIELDS).union(*map(engine_fields_in, obj.values()))
    if isinstance(obj, list):
        return set().union(*map(engine_fields_in, obj))
    return set()


def test_answers_carry_no_engine_field_and_name_the_model_as_asked(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    body = raw.http_response.json()
    assert engine_fields_in(body) == set()
    assert body["model"] == MODEL and body["system_fingerprint"].startswith("fp_dmx_v")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    assert chunks and engine_fields_in(chunks) == set()
    assert {chunk["model"] for chunk in chunks} == {MODEL}


def test_n_choices_are_each_generated_and_billed(client, committed):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Two answers."}],
        max_tokens=5,
        n=2,
        extra_body={"ignore_eos": True},
    )
    completion = raw.parse()
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 10
    record = usage_row(raw.headers["x-request-id"])
    assert (record.prompt_tokens, record.completion_tokens) == (
        completion.usage.prompt_tokens,
        10,
    )


def test_gateway_counts_prompt_tokens_exactly_as_vllm_does(client, platform, committed):
    """The gateway's own tokenizer and chat template agree with the engine's usage report."""
    from apps.models.selectors import catalog_load

    counter = catalog_load(version=0).get(MODEL).counter
    assert counter is not None, "the worker should have uploaded its tokenizer"
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Explain PagedAttention in one line, please. 你好！"},
    ]
    completion = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert counter.count_chat(messages) == completion.usage.prompt_tokens
    text = client.completions.create(model=MODEL, prompt="hello world, 你好", max_tokens=1)
    assert counter.count_prompts("hello world, 你好") == [text.usage.prompt_tokens]
