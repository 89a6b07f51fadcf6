"""The APIs today's clients speak, with those clients, against the running platform: OpenAI's
Responses API and embeddings, tools and structured output on chat, Anthropic's Messages API,
LangChain's ChatOpenAI and the OpenAI Agents SDK. Every call is a real vLLM round trip, and
every answer's usage is the one billed."""

from __future__ import annotations

import base64
import http.client
import json
import struct
import urllib.parse
import uuid
from typing import Any, Literal

import anthropic
import jsonschema
import openai
import pytest

from apps.billing.models import UsageRecord
from tests.gateway.test_limits import quota_used
from tests.gateway.test_openai_client import usage_row
from tests.http import call
from tests.keys.factories import make_api_key
from tests.stack import wait_for

MODEL = "dmx-tiny"
EMBED_MODEL = "dmx-tiny-embed"
# Strict, as OpenAI's `strict` means: the engine decodes the arguments constrained to the schema
# (without it vLLM's Hermes-format constraint leaves the arguments free, and random weights write
# anything, unless the call is forced: the gateway then marks the tool strict). The tiny
# vocabulary spells `<tool_call>{"name": …}` out in up to 130 tokens, hence the generous
# max_tokens of the tool tests.
TOOL_TOKENS = 300
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "sure": {"type": "boolean"},
    },
    "required": ["verdict", "sure"],
    "additionalProperties": False,
}


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


def billed(request_id: str, prompt: int, completion: int) -> UsageRecord:
    record = usage_row(request_id)
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
    return record


# -- Responses ----------------------------------------------------------------------------------


def test_a_response_is_created_and_billed(client, committed):
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        instructions="You are terse.",
        input="Say something.",
        max_output_tokens=9,
        extra_body={"ignore_eos": True},
    )
    response = raw.parse()
    assert response.object == "response" and response.model == MODEL
    assert response.status == "incomplete"  # it ran to max_output_tokens
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output_text
    assert response.usage.output_tokens == 9 and response.usage.input_tokens > 0
    record = billed(
        raw.headers["x-request-id"], response.usage.input_tokens, response.usage.output_tokens
    )
    assert record.endpoint == "responses" and record.status == "ok"


def test_a_streamed_response_sends_openais_events_and_usage_at_the_end(client, committed):
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=12, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    events = list(raw.parse())
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert final.output[0].content[0].text == text
    assert final.usage.output_tokens == 12
    record = billed(raw.headers["x-request-id"], final.usage.input_tokens, 12)
    assert record.stream and record.endpoint == "responses"


def test_a_forced_function_call_comes_back_as_a_function_call_item(client, committed):
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    response = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=TOOL_TOKENS,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_TOOL["function"]["parameters"])


def test_what_the_platform_does_not_keep_is_refused_by_name(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_123")
    assert raised.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="Hi", conversation="conv_123")
    assert raised.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}])
    assert raised.value.body["param"] == "tools[0].type"


# -- Tools and structured output on chat --------------------------------------------------------


def test_a_forced_tool_call_is_parsed(client, committed):
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=TOOL_TOKENS,
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


# The weather tool as clients mostly send it: no `strict`.
LAX_TOOL = {"name": "get_weather", "description": "The weather in a city."} | {
    "parameters": WEATHER_TOOL["function"]["parameters"]
}


def _forced_arguments(platform, dialect: str, stream: bool) -> list[Any]:
    """The arguments of a call forced to LAX_TOOL, as each API's own client hands them over."""
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    if dialect == "messages":
        claude = anthropic.Anthropic(base_url=platform.url, api_key=platform.api_key, max_retries=0)
        tool = {"name": LAX_TOOL["name"], "description": LAX_TOOL["description"]}
        tool["input_schema"] = LAX_TOOL["parameters"]
        params = {
            "model": MODEL,
            "max_tokens": TOOL_TOKENS,
            "messages": question,
            "tools": [tool],
            "tool_choice": {"type": "tool", "name": "get_weather"},
        }
        if stream:
            with claude.messages.stream(**params) as events:
                message = events.get_final_message()
        else:
            message = claude.messages.create(**params)
        return [block.input for block in message.content if block.type == "tool_use"]
    client = openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)
    if dialect == "responses":
        params = {
            "model": MODEL,
            "input": "Weather in Oslo?",
            "tools": [{"type": "function", **LAX_TOOL}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": TOOL_TOKENS,
        }
        if stream:
            with client.responses.stream(**params) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(**params)
        calls = [item for item in response.output if item.type == "function_call"]
        return [json.loads(call.arguments) for call in calls]
    params = {
        "model": MODEL,
        "messages": question,
        "tools": [{"type": "function", "function": LAX_TOOL}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": TOOL_TOKENS,
    }
    if stream:
        with client.chat.completions.stream(**params) as events:
            completion = events.get_final_completion()
    else:
        completion = client.chat.completions.create(**params)
    calls = completion.choices[0].message.tool_calls or []
    return [json.loads(call.function.arguments) for call in calls]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_forced_call_to_a_tool_not_marked_strict_follows_its_schema(platform, dialect, stream):
    """Forced, the call is the tool's, its arguments an object of the tool's schema, on every
    API, streamed and not, though the client did not ask for `strict` (the gateway does)."""
    (arguments,) = _forced_arguments(platform, dialect, stream)
    jsonschema.validate(arguments, LAX_TOOL["parameters"])


def test_auto_tool_choice_is_served_with_the_versions_parser(client):
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        tools=[WEATHER_TOOL],
        max_tokens=8,
    )
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_json_schema_output_is_valid_against_its_schema(client, committed):
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is water wet? Answer in JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
        },
        max_tokens=60,
    )
    jsonschema.validate(json.loads(completion.choices[0].message.content), ANSWER_SCHEMA)


# -- Embeddings ---------------------------------------------------------------------------------


def test_embeddings_of_a_batch_as_floats_and_base64(client, embed_worker, committed):
    texts = ["The quick brown fox.", "你好，世界", "SELECT 1;"]
    raw = client.embeddings.with_raw_response.create(model=EMBED_MODEL, input=texts)
    floats = raw.parse()
    assert [item.index for item in floats.data] == [0, 1, 2]
    dimensions = {len(item.embedding) for item in floats.data}
    assert len(dimensions) == 1 and dimensions.pop() > 0
    assert floats.model == EMBED_MODEL and floats.usage.prompt_tokens > 0
    billed(raw.headers["x-request-id"], floats.usage.prompt_tokens, 0)
    # base64: little-endian float32, as OpenAI encodes them (asked without the client's help,
    # which would decode them itself).
    encoded = client.post(
        "/embeddings",
        body={"model": EMBED_MODEL, "input": texts, "encoding_format": "base64"},
        cast_to=object,
    )
    first = encoded["data"][0]["embedding"]
    assert isinstance(first, str)
    decoded = struct.unpack(f"<{len(base64.b64decode(first)) // 4}f", base64.b64decode(first))
    assert decoded == pytest.approx(floats.data[0].embedding, rel=1e-5, abs=1e-6)


def test_a_model_of_the_other_kind_is_refused(client, embed_worker):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input="hi")
    assert (raised.value.body["param"], raised.value.body["code"]) == ("model", "unsupported_model")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.body["code"] == "unsupported_model"


# -- Anthropic's Messages API -------------------------------------------------------------------


@pytest.fixture
def claude(platform) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=platform.url, api_key=platform.api_key, max_retries=0
    )  # x-api-key, as Anthropic's clients send it


def test_a_message_is_created_and_billed(claude, committed):
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=7,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say something."}],
        extra_body={"ignore_eos": True},
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason == "max_tokens" and message.content[0].type == "text"
    assert message.usage.output_tokens == 7
    record = billed(raw.headers["x-request-id"], message.usage.input_tokens, 7)
    assert record.endpoint == "messages"


def test_a_streamed_message_arrives_as_anthropics_events(claude, committed):
    with claude.messages.stream(
        model=MODEL,
        max_tokens=10,
        messages=[{"role": "user", "content": "Tell me a story."}],
        extra_body={"ignore_eos": True},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.usage.output_tokens == 10 and final.stop_reason == "max_tokens"
    billed(request_id, final.usage.input_tokens, 10)


def test_a_forced_tool_use_with_anthropics_client(claude):
    message = claude.messages.create(
        model=MODEL,
        max_tokens=TOOL_TOKENS,
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        tools=[
            {
                "name": "get_weather",
                "description": "The weather in a city.",
                "input_schema": WEATHER_TOOL["function"]["parameters"],
                "strict": True,
            }
        ],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER_TOOL["function"]["parameters"])


def test_messages_errors_are_anthropics(claude, platform):
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude.messages.create(
            model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    wrong = anthropic.Anthropic(base_url=platform.url, api_key="sk-dmx-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        wrong.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert raised.value.body["error"]["type"] == "authentication_error"


def test_count_tokens_is_what_the_message_is_then_billed(claude, committed):
    """Anthropic's token counting: the SDK's count_tokens, then the same request created; the
    count is the prompt tokens the message is held and billed at, and counting itself is not
    recorded. Both answers carry Anthropic's `request-id` (the SDK's `_request_id`)."""
    params = {
        "model": MODEL,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": f"Weather in Lima, please ({uuid.uuid4()})?"}],
        "tools": [
            {
                "name": "get_weather",
                "description": "The weather in a city.",
                "input_schema": WEATHER_TOOL["function"]["parameters"],
            }
        ],
    }
    counted = claude.messages.count_tokens(**params)
    assert counted.input_tokens > 0 and counted._request_id.startswith("req_")
    raw = claude.messages.with_raw_response.create(
        max_tokens=3, tool_choice={"type": "none"}, extra_body={"ignore_eos": True}, **params
    )
    message = raw.parse()
    assert message._request_id == raw.headers["x-request-id"]
    assert usage_row(message._request_id).prompt_tokens == counted.input_tokens
    # The stream is drained in order: the count, sent first, would be stored by now.
    assert not UsageRecord.objects.filter(request_id=counted._request_id).exists()


def test_a_path_under_messages_is_a_404_in_anthropics_shape(claude, platform):
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.batches.list()
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "not_found_error"
    assert raised.value.response.headers["request-id"].startswith("req_")
    reply = call("GET", platform.url + "/v1/messages/count_tokens", key=platform.api_key)
    assert reply.status == 405 and reply.json()["error"]["type"] == "invalid_request_error"
    # Elsewhere under /v1, OpenAI's shape as before.
    missing = call("GET", platform.url + "/v1/no-such-thing", key=platform.api_key)
    assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"


# -- A client that leaves mid-stream ------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": "Tell me everything.", "max_output_tokens": 1500}),
        (
            "/v1/messages",
            {"max_tokens": 1500, "messages": [{"role": "user", "content": "Tell me everything."}]},
        ),
    ],
)
def test_a_client_leaving_mid_stream_is_billed_what_was_generated(platform, committed, path, body):
    key, secret = make_api_key(token_quota=10**9, token_quota_period="day")
    url = urllib.parse.urlsplit(platform.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    payload = json.dumps({"model": MODEL, "stream": True, "ignore_eos": True, **body})
    connection.request(
        "POST",
        path,
        body=payload,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    request_id = response.getheader("x-request-id")
    response.readline()  # the first event: the engine is generating
    response.close()  # leave, as a client does (see test_limits' chat test for why at once)
    connection.close()
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=20,
        what="the disconnected request's usage",
    )
    assert record.status == "client_disconnected", (record.status, record.completion_tokens)
    assert record.prompt_tokens > 0 and record.completion_tokens < 1500
    assert record.endpoint == path.rsplit("/", 1)[1]
    assert quota_used(key.key_id) == record.prompt_tokens + record.completion_tokens


# -- Libraries built on these APIs --------------------------------------------------------------


def test_langchain_chat_openai_streams_with_usage(platform, committed):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=MODEL,
        base_url=platform.api_url,
        api_key=platform.api_key,
        max_tokens=8,
        stream_usage=True,
        max_retries=0,
        extra_body={"ignore_eos": True},
    )
    chunks = list(chat.stream("Tell me about the sea."))
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.usage_metadata["output_tokens"] == 8
    assert total.usage_metadata["input_tokens"] > 0 and total.content


def test_langchain_structured_output(platform):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=MODEL, base_url=platform.api_url, api_key=platform.api_key, max_tokens=60,
        max_retries=0,
    )  # fmt: skip
    structured = chat.with_structured_output(
        {"title": "answer", "description": "A verdict.", **ANSWER_SCHEMA},
        method="json_schema",
        strict=True,
    )
    answer = structured.invoke("Is water wet?")
    jsonschema.validate(answer, ANSWER_SCHEMA)


def weather_agent(platform, calls: list[str]):
    """An OpenAI agent over the platform's Responses API with a weather tool it must call
    (`calls` gets each city asked for). The forced call's result is the answer: one model turn,
    then the tool (random weights never end a text answer on their own)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(
            model=MODEL,
            openai_client=openai.AsyncOpenAI(
                base_url=platform.api_url, api_key=platform.api_key, max_retries=0
            ),
        ),
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=TOOL_TOKENS),
        tool_use_behavior="stop_on_first_tool",
    )


def test_an_openai_agent_runs_over_the_responses_api(platform, committed):
    from agents import RunConfig, Runner

    calls: list[str] = []
    agent = weather_agent(platform, calls)
    before = UsageRecord.objects.filter(endpoint="responses").count()
    result = Runner.run_sync(
        agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True)
    )
    assert len(calls) == 1 and result.final_output == f"Sunny in {calls[0]}."
    # The agent's one model call went through the platform's Responses endpoint, and was billed.
    wait_for(
        lambda: UsageRecord.objects.filter(endpoint="responses").count() == before + 1,
        timeout=15,
        what="the agent's usage record",
    )


# -- The answers themselves, against OpenAI's schema ---------------------------------------------


def test_raw_answers_are_openais_objects_and_nothing_else(platform, embed_worker):
    """The bytes a client gets (not what a client library makes of them) validate against
    OpenAI's own schema (openai_schema/), engine fields and all."""
    from tests.gateway.test_dialects import validator

    reply = call(
        "POST",
        platform.api_url + "/responses",
        key=platform.api_key,
        json_body={"model": MODEL, "input": "Hi", "max_output_tokens": 5},
    )
    assert reply.status == 200
    problems = [e.message[:200] for e in validator("Response").iter_errors(reply.json())]
    assert not problems, problems
    reply = call(
        "POST",
        platform.api_url + "/embeddings",
        key=platform.api_key,
        json_body={"model": EMBED_MODEL, "input": ["a", "b"]},
    )
    assert reply.status == 200
    body = reply.json()
    problems = [e.message[:200] for e in validator("CreateEmbeddingResponse").iter_errors(body)]
    assert not problems, problems
    assert set(body) == {"object", "data", "model", "usage"}
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens"}
