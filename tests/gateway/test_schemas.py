import orjson
import pytest

from apps.gateway.schemas import Endpoint, parse_json, validate_completion
from dmxplatform.errors import InvalidRequestError


def chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_chat_request_is_summarised():
    request = validate_completion(
        Endpoint.CHAT, chat(stream=True, stream_options={"include_usage": True}, max_tokens=9, n=2)
    )
    assert (request.model, request.stream, request.include_usage) == ("m", True, True)
    assert (request.max_tokens, request.n) == (9, 2)


def test_max_completion_tokens_wins_over_max_tokens():
    request = validate_completion(Endpoint.CHAT, chat(max_tokens=5, max_completion_tokens=7))
    assert request.max_tokens == 7


def test_assistant_message_may_carry_tool_calls_instead_of_content():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    assert validate_completion(Endpoint.CHAT, chat(messages=messages)).model == "m"


def test_content_parts_are_accepted():
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert validate_completion(Endpoint.CHAT, chat(messages=messages)).stream is False


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_completion_prompts(prompt):
    request = validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt})
    assert request.prompt == prompt


@pytest.mark.parametrize("prompt", [[], [1, "a"], [[1], []], [True], {"text": "x"}, 5])
def test_bad_completion_prompts(prompt):
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt})
    assert error.value.param == "prompt"


def test_completions_allow_max_tokens_zero_for_echo_scoring():
    request = validate_completion(
        Endpoint.COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 0}
    )
    assert request.max_tokens == 0


def test_stream_null_means_false():
    assert validate_completion(Endpoint.CHAT, chat(stream=None)).stream is False


def test_parse_json():
    assert parse_json(b'{"a": 1}') == {"a": 1}
    for body in (b"", b"nul", b"[]", b'"s"'):
        with pytest.raises(InvalidRequestError):
            parse_json(body)


@pytest.mark.parametrize("text", [5, None, ["hi"], {"t": "hi"}])
@pytest.mark.parametrize("role", ["user", "system"])
def test_a_content_part_whose_text_is_not_a_string_is_400(role, text):
    """It used to pass here and fail in the token count with a 500."""
    parts = [{"type": "text", "text": "ok"}, {"type": "text", "text": text}]
    messages = [{"role": role, "content": parts}]
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.CHAT, chat(messages=messages))
    assert error.value.param == "messages[0].content[1].text"
    assert error.value.code == "invalid_type"


@pytest.mark.parametrize("part", ["hi", 3, {"text": "no type"}, {"type": 7}])
def test_a_content_part_must_be_an_object_with_a_type(part):
    messages = [{"role": "user", "content": [part]}]
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.CHAT, chat(messages=messages))
    assert error.value.param == "messages[0].content[0]"


def test_non_text_parts_pass_to_the_engine():
    parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert validate_completion(Endpoint.CHAT, chat(messages=[{"role": "user", "content": parts}]))


def nested(depth: int) -> bytes:
    """A chat body whose deepest value sits `depth` containers down."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return f'{{"model": "m", "messages": [], "x": {inner}}}'.encode()


@pytest.mark.parametrize("depth", [65, 255, 1023])
def test_json_nested_deeper_than_the_bound_is_refused_at_parse(depth):
    """orjson reads 1,024 levels and writes 254: bodies in between used to fail at the engine
    hop with a 500."""
    with pytest.raises(InvalidRequestError) as error:
        parse_json(nested(depth))
    assert error.value.code == "invalid_json"


def test_json_within_the_bound_parses():
    assert parse_json(nested(64))["model"] == "m"
    # Many brackets, little depth: the walk says so.
    wide = {"model": "m", "prompt": [[1, 2]] * 500}
    assert len(parse_json(orjson.dumps(wide))["prompt"]) == 500


@pytest.mark.parametrize("prompt", [[[True, False]], [[1, True]], [[-1]], [False]])
def test_booleans_and_negative_numbers_are_not_token_ids(prompt):
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt})
    assert error.value.param == "prompt"


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("functions", [{"name": "f", "parameters": {}}], "unsupported_parameter"),
        ("function_call", "auto", "unsupported_parameter"),
        ("prediction", {"type": "content", "content": "x"}, "unsupported_parameter"),
        ("audio", {"voice": "alloy", "format": "mp3"}, "unsupported_parameter"),
        ("web_search_options", {}, "unsupported_parameter"),
        ("store", True, "unsupported_value"),
        ("metadata", {"customer": "a"}, "unsupported_parameter"),
        ("service_tier", "flex", "unsupported_value"),
        ("service_tier", "priority", "unsupported_value"),
        ("service_tier", {"tier": "auto"}, "unsupported_value"),  # found by the fuzzing: a 500
        ("modalities", ["text", "audio"], "unsupported_value"),
    ],
)
def test_fields_no_engine_honours_are_refused_by_name(field, value, code):
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.CHAT, chat(**{field: value}))
    assert (error.value.param, error.value.code) == (field, code)


@pytest.mark.parametrize(
    "fields",
    [
        {"store": False, "metadata": {}, "service_tier": "auto"},
        {"service_tier": "default", "modalities": ["text"]},
        {"reasoning_effort": "low", "parallel_tool_calls": False},  # vLLM honours these
    ],
)
def test_fields_that_ask_for_nothing_unsupported_pass(fields):
    assert validate_completion(Endpoint.CHAT, chat(**fields)).payload.items() >= fields.items()


@pytest.mark.parametrize("tool_calls", [5, "call", [1, 2]])
def test_tool_calls_must_be_an_array_of_objects(tool_calls):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": tool_calls},
    ]
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.CHAT, chat(messages=messages))
    assert error.value.param == "messages[1].tool_calls"


@pytest.mark.parametrize("role", [{"a": 1}, ["user"], 5, None])
def test_a_role_of_another_type_is_400_not_500(role):
    """A dict or a list cannot even be looked up in the set of roles."""
    with pytest.raises(InvalidRequestError) as error:
        validate_completion(Endpoint.CHAT, chat(messages=[{"role": role, "content": "x"}]))
    assert error.value.param == "messages[0].role"


def _tools(*names: str, **strict: bool) -> list[dict]:
    tools = [{"type": "function", "function": {"name": name}} for name in names]
    for tool in tools:
        if tool["function"]["name"] in strict:
            tool["function"]["strict"] = strict[tool["function"]["name"]]
    return tools


def _strict_of(tool_choice) -> dict[str, object]:
    data = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": _tools("a", "b", "c", c=False),
        "tool_choice": tool_choice,
    }
    request = validate_completion(Endpoint.CHAT, data)
    return {t["function"]["name"]: t["function"].get("strict") for t in request.payload["tools"]}


@pytest.mark.parametrize(
    ("tool_choice", "strict"),
    [
        # The tool a call is forced to is strict; a client's own `strict: false` stands.
        ({"type": "function", "function": {"name": "a"}}, {"a": True, "b": None, "c": False}),
        ("required", {"a": True, "b": True, "c": False}),
        ("auto", {"a": None, "b": None, "c": False}),
        ("none", {"a": None, "b": None, "c": False}),
        (None, {"a": None, "b": None, "c": False}),
    ],
)
def test_a_forced_call_marks_its_tools_strict(tool_choice, strict):
    assert _strict_of(tool_choice) == strict
