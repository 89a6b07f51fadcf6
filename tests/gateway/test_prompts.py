import pytest

from apps.gateway.content_filter import ContentFilter, FilterAction, Term
from apps.gateway.prompts import intent_text, screen_prompt
from apps.gateway.schemas import Endpoint, validate_completion
from dmxplatform.errors import InvalidRequestError

FILTER = ContentFilter(
    [
        Term("forbidden", "test", FilterAction.BLOCK),
        Term("secret", "pii", FilterAction.MASK),
        Term("hmm", "watch", FilterAction.FLAG),
    ]
)


def chat(*messages) -> object:
    return validate_completion(Endpoint.CHAT, {"model": "m", "messages": list(messages)})


def test_intent_reads_the_last_user_message():
    request = chat(
        {"role": "system", "content": "You translate."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "the question"}]},
    )
    assert intent_text(request) == "the question"
    completion = validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": ["a", "b"]})
    assert intent_text(completion) == "a"


def test_a_blocked_term_anywhere_in_the_prompt_refuses_it():
    request = chat(
        {"role": "system", "content": "be nice"}, {"role": "user", "content": "f-o-r-b-i-d-d-e-n"}
    )
    with pytest.raises(InvalidRequestError) as error:
        screen_prompt(FILTER, request)
    assert (error.value.code, error.value.param) == ("content_policy_violation", "messages")


def test_masked_terms_are_masked_in_place_and_flags_returned():
    request = chat(
        {"role": "user", "content": [{"type": "text", "text": "my SECRET code, hmm"}]},
    )
    assert screen_prompt(FILTER, request) == ["hmm"]
    text = request.payload["messages"][0]["content"][0]["text"]
    assert "SECRET" not in text and text.startswith("my ") and text.endswith(" code, hmm")


def test_completion_prompts_are_screened_too():
    request = validate_completion(
        Endpoint.COMPLETIONS, {"model": "m", "prompt": ["ok", "a secret"]}
    )
    screen_prompt(FILTER, request)
    assert request.payload["prompt"][0] == "ok" and "secret" not in request.payload["prompt"][1]
    blocked = validate_completion(Endpoint.COMPLETIONS, {"model": "m", "prompt": "forbidden"})
    with pytest.raises(InvalidRequestError) as error:
        screen_prompt(FILTER, blocked)
    assert error.value.param == "prompt"


def test_no_terms_no_work():
    request = chat({"role": "user", "content": "forbidden"})
    assert screen_prompt(ContentFilter(()), request) == []


def test_affinity_key_is_the_shared_system_prompt():
    from apps.gateway.prompts import affinity_key

    system = {"role": "system", "content": "You are a helpful assistant for ACME. " * 5}
    a = chat(system, {"role": "user", "content": "first question"})
    b = chat(system, {"role": "user", "content": "another question"})
    c = chat({"role": "user", "content": "first question"})
    assert affinity_key(a) == affinity_key(b) != affinity_key(c)
    assert affinity_key(c) != affinity_key(chat({"role": "user", "content": "something else"}))
