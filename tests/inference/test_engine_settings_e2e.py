"""Real workers start vLLM with their version's registry settings: the tiny model's versions with
vLLM's hermes tool parser (tools reach the engine, and are counted as it renders them), the
embedding model as a pooling model that answers /v1/embeddings, in floats and in base64."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from apps.hardware.models import Node
from tests.conftest import EMBED_MODEL, SERVED_MODELS, TOOL_CALL_PARSER
from tests.http import call
from tests.stack import tiny_prompt_counter

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Lyon"]},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "metric"],
            "additionalProperties": False,
        },
        # vLLM 0.32 pins a named call's arguments to the schema only for strict tools (or
        # under --tool-strict-level parameter); otherwise any JSON value passes.
        "strict": True,
    },
}
HISTORY = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris","metric":true}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"},
]


def engine_args(worker) -> dict:
    return Node.objects.get(name=worker.node_name).engine_args


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def chat(worker, body: dict) -> dict:
    reply = call(
        "POST",
        f"http://127.0.0.1:{worker.port}/v1/chat/completions",
        json_body={"model": SERVED_MODELS[0], **body},
        timeout=120,
    )
    assert reply.status == 200, reply.body[:500]
    return reply.json()


def test_a_version_with_a_tool_parser_runs_vllm_with_it(platform, committed):
    worker = platform.workers["dmx-tiny"]
    registered = engine_args(worker)
    argv = registered["argv"]
    assert "--enable-auto-tool-choice" in argv
    assert flag(argv, "--tool-call-parser") == TOOL_CALL_PARSER
    assert "--runner" not in argv and "--chat-template" not in argv
    assert registered["settings"] == {
        "kind": "generate",
        "tool_call_parser": TOOL_CALL_PARSER,
        "reasoning_parser": None,
        "chat_template_sha256": None,
    }
    assert "vLLM flags from them: --enable-auto-tool-choice --tool-call-parser hermes" in (
        worker.log_path.read_text(errors="replace")
    )
    # A version without settings: vLLM's defaults.
    assert "--tool-call-parser" not in engine_args(platform.workers["dmx-tiny-b"])["argv"]


def test_the_engine_takes_tools_and_counts_them_as_the_gateway_does(platform):
    worker = platform.workers["dmx-tiny"]
    question = [{"role": "user", "content": "Weather in Paris?"}]
    # tool_choice auto: no longer refused; the random weights seldom call a tool.
    auto = chat(worker, {"messages": question, "tools": [WEATHER], "max_tokens": 4})
    counter = tiny_prompt_counter()
    assert auto["usage"]["prompt_tokens"] == counter.count_chat(question, [WEATHER])
    # A history of calls and results, as the tiny template renders them.
    history = chat(worker, {"messages": HISTORY, "tools": [WEATHER], "max_tokens": 4})
    assert history["usage"]["prompt_tokens"] == counter.count_chat(HISTORY, [WEATHER])
    # A named tool: decoding is held to the call's schema, whatever the weights.
    named = chat(
        worker,
        {
            "messages": question,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            # Room for a call the random weights draw out (likely with the whitespace the schema
            # allows between tokens): at 200 no call came back in two full runs of five.
            "max_tokens": 800,
        },
    )
    choice = named["choices"][0]
    assert "tool_calls" in choice["message"], choice  # finish_reason says why, if not
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather"
    arguments = json.loads(tool_call["function"]["arguments"])
    assert arguments["city"] in ("Paris", "Lyon") and isinstance(arguments["metric"], bool)
    assert set(arguments) == {"city", "metric"}


def test_the_embedding_model_runs_as_a_pooling_model(platform, embed_worker, committed):
    argv = engine_args(embed_worker)["argv"]
    assert flag(argv, "--runner") == "pooling" and flag(argv, "--convert") == "embed"
    assert "--tool-call-parser" not in argv
    url = f"http://127.0.0.1:{embed_worker.port}/v1/embeddings"
    texts = ["The quick brown fox.", "你好，世界"]
    floats = call("POST", url, json_body={"model": EMBED_MODEL, "input": texts}, timeout=60)
    assert floats.status == 200, floats.body[:500]
    data = floats.json()["data"]
    assert [item["index"] for item in data] == [0, 1]
    dims = {len(item["embedding"]) for item in data}
    assert dims == {128}  # the tiny model's hidden size
    assert data[0]["embedding"] != data[1]["embedding"]
    assert floats.json()["usage"]["prompt_tokens"] == sum(
        tiny_prompt_counter().count_text(text) for text in texts
    )
    encoded = call(
        "POST",
        url,
        json_body={"model": EMBED_MODEL, "input": texts, "encoding_format": "base64"},
        timeout=60,
    )
    assert encoded.status == 200, encoded.body[:500]
    for as_float, as_base64 in zip(data, encoded.json()["data"], strict=True):
        raw = base64.b64decode(as_base64["embedding"])
        assert len(raw) == 4 * 128  # little-endian float32s
        decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert decoded == pytest.approx(as_float["embedding"], rel=1e-6, abs=1e-7)
