"""Prompt counting with the tiny model's own tokenizer files (e2e checks them against vLLM)."""

import json

import pytest

from apps.models.tokenizers import ChatTemplateError, PromptCounter, message_text
from tests.stack import build_tiny_model, tiny_prompt_counter


@pytest.fixture(scope="module")
def counter() -> PromptCounter:
    return tiny_prompt_counter()


def test_chat_renders_the_template_and_opens_the_reply(counter):
    rendered = counter.render_chat([{"role": "user", "content": "hi"}])
    assert rendered == "<|begin_of_text|><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert counter.count_chat([{"role": "user", "content": "hi"}]) == counter.count_text(rendered)
    # Special tokens are single tokens, as in the engine.
    assert counter.count_text("<|im_start|>") == 1
    assert counter.count_text("<|im_start|><|im_end|>") == 2


def test_longer_prompts_count_more(counter):
    short = counter.count_chat([{"role": "user", "content": "hello"}])
    longer = counter.count_chat([{"role": "user", "content": "hello " * 50}])
    assert longer > short + 40


def test_content_parts_count_as_their_text(counter):
    parts = [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert counter.count_chat([{"role": "user", "content": parts}]) == counter.count_chat(
        [{"role": "user", "content": "hello"}]
    )
    assert message_text(parts) == "hello"
    assert message_text(None) == ""


def test_completion_prompts(counter):
    assert counter.count_prompts([1, 2, 3]) == [3]
    assert counter.count_prompts([[1, 2], [3]]) == [2, 1]
    assert counter.count_prompts(["a", "hello world"]) == [
        counter.count_text("a"),
        counter.count_text("hello world"),
    ]


def test_completion_text_prompts_count_the_special_tokens_vllm_adds(counter):
    """A tokenizer that puts a BOS before every text (Llama's, Mistral's): vLLM's completions
    and embeddings add it to a text prompt, so the count does; a chat's rendered prompt has its
    own from the template, and ids are taken as they are."""
    spec = json.loads(counter._tokenizer.to_str())
    bos = "<|begin_of_text|>"
    bos_id = counter._tokenizer.token_to_id(bos)
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    llama_like = PromptCounter(
        tokenizer_json=json.dumps(spec), chat_template="", bos_token=bos, eos_token=""
    )
    plain = counter.count_text("hello world")
    assert llama_like.prompt_ids("hello world") == [bos_id, *counter.text_ids("hello world")]
    assert llama_like.count_prompts(["a", "hello world"]) == [
        counter.count_text("a") + 1,
        plain + 1,
    ]
    assert llama_like.count_prompts([7, 8, 9]) == [3]
    assert llama_like.count_text("hello world") == plain  # a rendered chat prompt: no BOS added
    # The tiny model's tokenizer adds none: its counts stand as they were.
    assert counter.count_prompts(["hello world"]) == [plain]


def test_chinese_text_is_counted(counter):
    assert counter.count_text("你好，请帮我翻译") >= 4


def test_a_model_without_chat_template_refuses_chat(counter):
    bare = PromptCounter(
        tokenizer_json=counter._tokenizer.to_str(), chat_template="", bos_token="", eos_token=""
    )
    with pytest.raises(ChatTemplateError):
        bare.count_chat([{"role": "user", "content": "x"}])


def test_template_exceptions_become_chat_template_errors():
    counter = PromptCounter(
        tokenizer_json=build_tiny_model().joinpath("tokenizer.json").read_text(),
        chat_template="{{ raise_exception('roles must alternate') }}",
        bos_token="",
        eos_token="",
    )
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        counter.count_chat([{"role": "user", "content": "x"}])


def test_the_longest_token_bounds_the_count_from_below(counter):
    assert counter.longest_token_chars >= len("<|begin_of_text|>")
    for text in ("hello world " * 300, "你好，世界" * 200, "x" * 5000, "<|im_start|>" * 50):
        assert counter.min_tokens(len(text)) <= counter.count_text(text)


@pytest.mark.parametrize("repeats", [1, 40, 2000])
def test_the_batch_api_counts_as_the_tokenizer_encodes(counter, repeats):
    """Texts are counted with the batch API (GIL released, no offsets kept): the same ids as
    `encode`, short and long, with and without special tokens."""
    text = "The quick brown fox, 你好. " * repeats
    for special in (False, True):
        expected = counter._tokenizer.encode(text, add_special_tokens=special).ids
        assert counter._encode(text, special=special).ids == expected
    assert counter.text_ids(text) == counter._tokenizer.encode(text, add_special_tokens=False).ids


# The part of a tool-calling chat template (Qwen 2.5's, as shipped) that reads tool calls.
TOOL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{{ tool_call.function.name }}{{ tool_call.function.arguments | tojson }}"
    "{%- endfor %}{%- else %}{{ message.content }}{%- endif %}"
    "{%- endfor %}"
)


@pytest.mark.parametrize(
    "tool_calls",
    [5, ["f"], [{"type": "function", "function": "f"}], [{"type": "custom", "function": {}}]],
    ids=["not-a-list", "call-not-an-object", "function-not-an-object", "not-a-function"],
)
def test_what_a_template_trips_over_in_the_messages_is_the_requests_fault(tool_calls):
    """It used to be a TypeError from inside the template: a 500."""
    directory = build_tiny_model()
    counter = PromptCounter(
        tokenizer_json=(directory / "tokenizer.json").read_text(),
        chat_template=TOOL_TEMPLATE,
        bos_token="",
        eos_token="",
    )
    with pytest.raises(ChatTemplateError):
        counter.render_chat([{"role": "assistant", "content": None, "tool_calls": tool_calls}])


@pytest.mark.parametrize("arguments", ["", "{not json", "[1, 2]", "7", None, {"a": 1}])
def test_tool_call_arguments_reach_the_template_as_objects_as_vllm_makes_them(arguments):
    """vLLM parses each call's arguments into an object, {} for what is none (it does not
    refuse the turn); templates write them with tojson."""
    counter = PromptCounter(
        tokenizer_json=build_tiny_model().joinpath("tokenizer.json").read_text(),
        chat_template=TOOL_TEMPLATE,
        bos_token="",
        eos_token="",
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    rendered = counter.render_chat([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert rendered == ('f{"a": 1}' if arguments == {"a": 1} else "f{}")
    assert call["function"]["arguments"] == arguments  # the request's body is left as it came
    # JSON text is parsed, and written back as json.dumps does (what the client spaced or
    # escaped is not what the engine counts).
    call["function"]["arguments"] = '{"city":"Zürich","n":1}'
    rendered = counter.render_chat([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert rendered == 'f{"city": "Zürich", "n": 1}'


def _counter(tokenizer) -> PromptCounter:
    return PromptCounter(
        tokenizer_json=tokenizer.to_str(), chat_template="", bos_token="", eos_token=""
    )


def _trained(model, trainer, *, normalizer=None, pre_tokenizer=None):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer(model)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(["hello world, 你好世界"] * 50, trainer=trainer)
    return tokenizer


def test_the_bound_is_only_given_where_every_token_stands_for_a_character():
    """WordPiece makes one token of a run of spaces, Unigram of unknown characters, a
    stripping normalizer drops text: for them characters over the longest token bound
    nothing, and refusing by it would refuse prompts that fit."""
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    byte_level = _trained(
        models.BPE(),
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
        pre_tokenizer=pre_tokenizers.ByteLevel(),
    )
    sentencepiece_like = _trained(
        models.BPE(byte_fallback=True, unk_token="<unk>"),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]),
        normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
    )
    wordpiece = _trained(
        models.WordPiece(unk_token="[UNK]"),
        trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"]),
        pre_tokenizer=pre_tokenizers.Whitespace(),
    )
    unigram = _trained(models.Unigram(), trainers.UnigramTrainer(vocab_size=100))
    stripping = _trained(
        models.BPE(),
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
        normalizer=normalizers.Strip(),
        pre_tokenizer=pre_tokenizers.ByteLevel(),
    )
    assert _counter(byte_level).longest_token_chars
    assert _counter(sentencepiece_like).longest_token_chars
    for kind in (wordpiece, unigram, stripping):
        counter = _counter(kind)
        assert counter.longest_token_chars is None
        assert counter.min_tokens(10**6) == 0
    spaced = "a" + " " * 100_000 + "b"
    assert _counter(wordpiece).count_text(spaced) < 10  # what the bound would have refused
