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
