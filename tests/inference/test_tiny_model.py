"""The tiny model's chat template: plain ChatML without tools, Hermes-style tool calling with
them, rendered alike by the gateway's counter and by vLLM (its message parsing and transformers'
apply_chat_template, run in the worker's virtualenv)."""

from __future__ import annotations

import json
import subprocess

import pytest

from inference.tiny_model import CHAT_TEMPLATE
from tests.stack import ROOT, WORKER_PYTHON, build_tiny_model, tiny_prompt_counter

# The template before tools: prompts without tools must render (and count) as they did.
CHATML = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
            "required": ["city", "metric"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
# A tool as a client may send it: no description, a key vLLM drops.
BARE = {"type": "function", "function": {"name": "now", "extra": 1}}
CALL_HISTORY = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Zürich and Lyon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Zürich","metric":true}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Lyon", "metric": true}',
                },
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "20 C"}]},
    {"role": "assistant", "content": "Rain in Zürich, 20 C in Lyon."},
    {"role": "user", "content": "Thanks!"},
]
PLAIN = [
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi\n\n  there"},
    {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
]
# (messages, tools): what vLLM and the counter must render alike.
CASES = {
    "plain": (PLAIN, None),
    "tools": ([{"role": "user", "content": "Weather?"}], [WEATHER, BARE]),
    "tools-and-system": (PLAIN, [WEATHER]),
    "tool-call-history": (CALL_HISTORY, [WEATHER]),
    "tool-call-history-no-tools": (CALL_HISTORY, None),
}

# vLLM 0.32's own rendering of a chat request: its request model (tools as it dumps them), its
# message parsing (content to text, tool call arguments to objects), the tokenizer's template.
VLLM_RENDER = """
import json, sys
from transformers import AutoTokenizer
from vllm.config import ModelConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import parse_chat_messages

data = json.load(sys.stdin)
config = ModelConfig(model=data["model"], dtype="float32")
tokenizer = AutoTokenizer.from_pretrained(data["model"])
rendered = {}
for name, (messages, tools) in data["cases"].items():
    request = ChatCompletionRequest(model="m", messages=messages, tools=tools)
    dumped = [tool.model_dump() for tool in request.tools] if request.tools is not None else None
    conversation, _, _ = parse_chat_messages(request.messages, config, "string")
    rendered[name] = tokenizer.apply_chat_template(
        conversation, tools=dumped, tokenize=False, add_generation_prompt=True
    )
print(json.dumps(rendered))
"""


@pytest.fixture(scope="module")
def counter():
    return tiny_prompt_counter()


@pytest.fixture(scope="module")
def vllm_rendered() -> dict[str, str]:
    directory = build_tiny_model()
    done = subprocess.run(
        [str(WORKER_PYTHON), "-c", VLLM_RENDER],
        input=json.dumps({"model": str(directory), "cases": CASES}),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "VLLM_NO_USAGE_STATS": "1"},
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_built_model_carries_the_template():
    config = json.loads((build_tiny_model() / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],
        PLAIN,
        [{"role": "user", "content": ""}],
        [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
    ],
)
def test_prompts_without_tools_render_as_plain_chatml_did(counter, messages):
    from apps.models.tokenizers import PromptCounter

    before = PromptCounter(
        tokenizer_json=counter._tokenizer.to_str(),
        chat_template=CHATML,
        bos_token=counter._bos,
        eos_token=counter._eos,
    )
    assert counter.render_chat(messages) == before.render_chat(messages)
    assert counter.chat_ids(messages) == before.chat_ids(messages)
    assert counter.chat_ids(messages, tools=None) == before.chat_ids(messages)


def test_tools_are_listed_in_a_system_block_with_the_call_format(counter):
    rendered = counter.render_chat(PLAIN, tools=[WEATHER])
    system, rest = rendered.split("<|im_end|>\n", 1)
    assert system.startswith("<|begin_of_text|><|im_start|>system\nBe nice.\n\n# Tools\n")
    tools = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools) == WEATHER  # one tool a line, as JSON
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' in system
    # The system message is in the tools block, not again after it.
    assert rest.startswith("<|im_start|>user\nhello<|im_end|>\n")
    assert "Be nice." not in rest
    # Without a system message the block holds the tools alone.
    alone = counter.render_chat([{"role": "user", "content": "x"}], tools=[WEATHER])
    assert alone.startswith("<|begin_of_text|><|im_start|>system\n# Tools\n")
    # More tokens with tools than without: the gateway counts them.
    assert counter.count_chat(PLAIN, tools=[WEATHER]) > counter.count_chat(PLAIN) + 50


def test_tool_calls_and_results_render_as_hermes_blocks(counter):
    rendered = counter.render_chat(CALL_HISTORY, tools=[WEATHER])
    assert (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "metric": true}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "metric": true}}\n'
        "</tool_call><|im_end|>\n"
    ) in rendered
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\n12 C, rain\n</tool_response>\n"
        "<tool_response>\n20 C\n</tool_response><|im_end|>\n"
    ) in rendered
    assert "None" not in rendered
    assert rendered.endswith("<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")


def test_an_assistant_turn_with_text_and_a_call_keeps_both(counter):
    turn = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}],
    }
    rendered = counter.render_chat([{"role": "user", "content": "time?"}, turn])
    assert (
        "<|im_start|>assistant\nLet me look.\n"
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
    ) in rendered


@pytest.mark.parametrize("case", CASES)
def test_the_counter_renders_what_vllm_renders(counter, vllm_rendered, case):
    messages, tools = CASES[case]
    assert counter.render_chat(messages, tools=tools) == vllm_rendered[case]
