"""Count prompt tokens with a model's own tokenizer and chat template, as vLLM will."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by the model's chat template."""


def _raise_exception(message: str) -> None:
    # Chat templates call raise_exception() to reject messages (for example a bad role order).
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now(tz=UTC).strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter, which chat templates are written for: Jinja's own sorts keys and
    # escapes HTML characters, and would render tools and tool calls unlike the engine.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _template_environment() -> ImmutableSandboxedEnvironment:
    # The same environment transformers renders chat templates in (its `{% generation %}`
    # extension aside, which only marks the assistant's tokens).
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def compile_chat_template(template: str) -> Template:
    """Compile a chat template as the gateway renders it; raise jinja2's TemplateSyntaxError."""
    return _template_environment().from_string(template)


def engine_tools(tools: Sequence[Any]) -> list[Any]:
    """A chat request's `tools` as vLLM hands them to the template: each tool's `type` and its
    function's name, description and parameters (null when not given), its `strict` flag when
    given; other keys dropped (vLLM 0.32's ChatCompletionToolsParam.model_dump)."""
    shaped: list[Any] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            shaped.append(tool)  # not a tool: the request's schema check refuses it
            continue
        defined = {
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        for optional in ("strict", "defer_loading"):
            if function.get(optional) is not None:
                defined[optional] = function[optional]
        if tool.get("defer_loading") is not None and "defer_loading" not in defined:
            defined["defer_loading"] = tool["defer_loading"]
        shaped.append({"type": tool.get("type", "function"), "function": defined})
    return shaped


def _engine_tool_calls(tool_calls: Any) -> Any:
    """An assistant's tool calls as vLLM hands them to the template: each function's
    `arguments` parsed from its JSON text into an object ({} when empty, not JSON or not an
    object: vLLM 0.32's chat_utils._postprocess_messages)."""
    if not isinstance(tool_calls, list):
        return tool_calls
    shaped = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ChatTemplateError("assistant tool_calls entries must be function calls")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        shaped.append(
            {
                **call,
                "function": {
                    **function,
                    "arguments": arguments if isinstance(arguments, dict) else {},
                },
            }
        )
    return shaped


def _engine_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as vLLM renders it: its text, its tool calls' arguments parsed."""
    shaped = {**message, "content": message_text(message.get("content"))}
    if message.get("role") == "assistant" and "tool_calls" in message:
        if message["tool_calls"] is None or message["tool_calls"] == []:
            shaped.pop("tool_calls")  # vLLM keeps templates on the plain assistant path
        else:
            shaped["tool_calls"] = _engine_tool_calls(message["tool_calls"])
    return shaped


def message_text(content: Any) -> str:
    """Return a message's text: a string, or the text parts of a content list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and "text" in part
        )
    return ""


# Normalizers after which text has at least about as many characters as before (composition,
# NFC's, can join at most a few into one: slack the bound's looseness absorbs). Strip,
# whitespace collapsing and the like can shrink text without limit, and void the bound.
_LENGTH_KEEPING_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend"})


def _length_keeping(normalizer: dict[str, Any] | None) -> bool:
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_length_keeping(n) for n in normalizer.get("normalizers", []))
    if kind == "Replace":  # SentencePiece's " " -> "▁": safe when nothing gets shorter
        pattern = (normalizer.get("pattern") or {}).get("String")
        return pattern is not None and len(normalizer.get("content", "")) >= len(pattern)
    return kind in _LENGTH_KEEPING_NORMALIZERS


def _byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


def _bound_holds(spec: dict[str, Any]) -> bool:
    """Whether every token of this tokenizer stands for at least one character of the text, so
    that characters over the longest token bound the count from below: BPE over bytes (GPT-2's
    byte-level kind, or SentencePiece's with byte fallback), after normalizers that keep the
    length. WordPiece, Unigram and BPE that fuse unknown characters make one token of any run."""
    model = spec.get("model") or {}
    return (
        model.get("type") == "BPE"
        and (_byte_level(spec.get("pre_tokenizer")) or bool(model.get("byte_fallback")))
        and _length_keeping(spec.get("normalizer"))
    )


def prompt_chars(content: Any) -> int:
    """The characters of a message's text, without joining its parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


class PromptCounter:
    """A loaded tokenizer and chat template; built once per tokenizer and shared."""

    def __init__(self, *, tokenizer_json: str, chat_template: str, bos_token: str, eos_token: str):
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._template = compile_chat_template(chat_template) if chat_template else None
        self._bos = bos_token
        self._eos = eos_token
        # One token covers at most this many characters of text (a vocabulary entry is at least
        # as long as the text it stands for; a byte-level one has a character per byte), where
        # the tokenizer is of a kind for which that holds; None where it is not.
        self.longest_token_chars = (
            max(
                (len(token) for token in self._tokenizer.get_vocab(with_added_tokens=True)),
                default=1,
            )
            if _bound_holds(json.loads(tokenizer_json))
            else None
        )

    def min_tokens(self, chars: int) -> int:
        """The fewest tokens text of `chars` characters can make (0 where the tokenizer gives
        no such bound): known without tokenizing, it refuses a prompt that cannot fit before
        paying for its count."""
        if self.longest_token_chars is None:
            return 0
        return -(-chars // self.longest_token_chars)

    def count_text(self, text: str) -> int:
        """Return the token count of raw text, without special tokens."""
        return len(self._encode(text))

    def text_ids(self, text: str) -> list[int]:
        """Return the token ids of raw text, without special tokens (as vLLM tokenizes a
        rendered chat prompt)."""
        return self._encode(text).ids

    def _encode(self, text: str, *, special: bool = False):
        # The batch API without offsets, for one text: the same ids as `encode`, for less CPU
        # at every length (measured here: 12% less at 30 characters, 30% at 8 KB, 18% on
        # bench/workload.py's prompts); it releases the GIL (a worker thread counting a long
        # prompt leaves the event loop free) and keeps no offsets (a million-token Encoding
        # with them weighs hundreds of MB).
        return self._tokenizer.encode_batch_fast([text], add_special_tokens=special)[0]

    def prompt_ids(self, prompt: str | Sequence[Any]) -> list[int] | None:
        """Return the token ids of a completions (or embeddings) request's one prompt (text, or
        ids already); None for a batch of prompts. Text gets the tokenizer's special tokens (a
        Llama's BOS), as vLLM adds them to these endpoints' text prompts (its
        `add_special_tokens`, true by default there): counted without, every prompt would be
        held and billed a token short. Ids are the engine's as they are."""
        if isinstance(prompt, str):
            return self._encode(prompt, special=True).ids
        if prompt and all(isinstance(item, int) for item in prompt):
            return list(prompt)
        return None

    def count_prompts(self, prompt: str | Sequence[Any]) -> list[int]:
        """Return the token count of each prompt of a completions (or embeddings) request."""
        ids = self.prompt_ids(prompt)
        if ids is not None:
            return [len(ids)]
        return [
            len(self._encode(item, special=True)) if isinstance(item, str) else len(item)
            for item in prompt
        ]

    def render_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
    ) -> str:
        """Render messages (and a chat request's `tools`, None when it has none) through the
        chat template as vLLM does, opening the assistant's reply."""
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        plain = [_engine_message(message) for message in messages]
        try:
            return self._template.render(
                messages=plain,
                tools=engine_tools(tools) if tools is not None else None,
                documents=None,
                add_generation_prompt=True,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            # The template is the model's and runs sandboxed on the request's messages: what
            # it trips over in them (tool_calls of the wrong type, `tojson` of what is not
            # JSON) is the request's fault, a 400, as vLLM answers it.
            raise ChatTemplateError(f"{exc.__class__.__name__}: {exc}") from exc

    def count_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
    ) -> int:
        """Return the prompt token count of a chat request."""
        return self.count_text(self.render_chat(messages, tools))

    def chat_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        """Return the prompt token ids of a chat request (its messages and `tools`)."""
        return self.text_ids(self.render_chat(messages, tools))
