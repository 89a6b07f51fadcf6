"""Build the tiny offline model: a byte-level BPE tokenizer, a chat template, random Llama weights.

No model hub is reachable where the platform is developed and tested, so the project makes its
own model. Its text is gibberish; token counts, streaming, stop conditions and engine metrics are
real, which is everything the platform needs to exercise. Deterministic: the same seed and corpus
give the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

VOCAB_SIZE = 2048  # small enough for a ~1 MB model, large enough that English words merge
HIDDEN_SIZE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # grouped-query attention, as in current Llama models, so GQA paths are exercised
MAX_CONTEXT = 2048
SEED = 20261129

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"

# ChatML, the format Qwen and many fine-tunes use; `add_generation_prompt` opens the reply.
# With `tools`, Hermes-style tool calling as Qwen 2.5's template does it (vLLM's `hermes` tool
# parser reads the replies): a system block lists the tools within <tools></tools> (the
# request's system message first, if any) and asks for calls as <tool_call>{"name": ...,
# "arguments": ...}</tool_call>; an assistant's tool calls are rendered so, tool results as
# <tool_response> blocks within one user turn. Prompts without tools render as plain ChatML
# did before tools were added. Newlines after a block tag are written as expressions: the
# environment's trim_blocks (transformers' and vLLM's) drops a literal one.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] if messages[0]['content'] is not none else '' }}{{ '\\n\\n' }}"
    "{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] if message['content'] is not none else '' %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "<|im_start|>assistant{% if content %}{{ '\\n' }}{{ content }}{% endif %}"
    "{% for tool_call in message['tool_calls'] %}"
    "{% set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' }}{{ call['name'] }}{{ '\", \"arguments\": ' }}"
    "{% if call['arguments'] is string %}{{ call['arguments'] }}"
    "{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ content }}{{ '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Explain how a hash map works and when to use one.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize the following text in three sentences.",
    "Compare PostgreSQL and MySQL: pros and cons of each.",
    "Translate this sentence into French, please.",
    "What is the integral of x squared from zero to one?",
    "Hello! How are you today? Thanks for your help.",
    "Write a short poem about the sea at night.",
    "SELECT id, name FROM users WHERE created_at > now() - interval '1 day';",
    "def main():\n    print('hello world')\n",
    "你好，请帮我把这段话翻译成英文。",
    "请解释一下什么是机器学习。",
    "写一首关于春天的诗。",
    "计算一下二十三乘以四十七等于多少。",
    "比较一下Python和Java的优缺点。",
]


def corpus() -> list[str]:
    """Return the training text: the lines above, repeated so BPE sees frequent pairs."""
    return CORPUS_LINES * 50


def build_tokenizer(out: Path) -> None:
    """Train a byte-level BPE tokenizer and write tokenizer.json plus its config files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "model_max_length": MAX_CONTEXT,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


def build_weights(out: Path) -> None:
    """Save a randomly initialised Llama model with the tokenizer's special-token ids."""
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=HIDDEN_SIZE * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_CONTEXT,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
        tie_word_embeddings=True,
        # float32, run with `--dtype float32`: vLLM's bfloat16 CPU attention takes an AMX path
        # that dies with SIGILL on some virtual machines that advertise AMX.
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)


def _builder_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def build(out: Path) -> Path:
    """Write the model directory, unless this builder already wrote it; return it."""
    stamp = out / ".dmx-builder"
    if stamp.exists() and stamp.read_text() == _builder_digest():
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_weights(out)
    stamp.write_text(_builder_digest())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    args = parser.parse_args()
    print(build(args.out))


if __name__ == "__main__":
    main()
