"""What a model version tells the engine that serves it: vLLM's tool-call and reasoning parsers,
and a chat template over the tokenizer's. Workers read them before starting vLLM
(inference.worker), gateways count prompts with the template (apps.models.selectors)."""

from __future__ import annotations

from jinja2.exceptions import TemplateError, TemplateSyntaxError

from apps.models.tokenizers import compile_chat_template

# vLLM 0.32.0's `--tool-call-parser` choices (`--help=all`; its ToolParserManager), without
# those a `--tool-parser-plugin` registers: read again when the workers' vLLM is upgraded.
TOOL_CALL_PARSERS = (
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31",
    "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4",
    "gigachat3", "glm45", "glm47", "granite", "granite-20b-fc", "granite4", "hermes", "hf",
    "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba", "k2_horizon", "kimi_k2",
    "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer", "olmo3", "openai",
    "phi4_mini_json", "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json",
    "qwen3_xml", "seed_oss", "step3", "step3p5", "xlam",
)  # fmt: skip

# vLLM 0.32.0's `--reasoning-parser` names (vllm.reasoning.ReasoningParserManager), likewise.
REASONING_PARSERS = (
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4",
    "deepseek_v41", "ernie45", "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser",
    "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "k2_horizon", "kimi_k2",
    "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2", "minimax_m2_append_think",
    "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3", "olmo3", "openai_gptoss", "plamo3",
    "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5",
)  # fmt: skip


def parser_error(name: str, known: tuple[str, ...], flag: str) -> str | None:
    """Why `name` is not one of vLLM's parsers for `flag`; None when it is (or is empty)."""
    if not name or name in known:
        return None
    return f"vLLM 0.32 has no {flag} named {name!r}; it has {', '.join(known)}."


def chat_template_error(template: str) -> str | None:
    """Why a chat template does not compile; None when it does (or is empty)."""
    if not template:
        return None
    try:
        compile_chat_template(template)
    except TemplateSyntaxError as exc:
        return f"The template does not compile: {exc.message} (line {exc.lineno})."
    except TemplateError as exc:
        return f"The template does not compile: {exc}."
    return None
