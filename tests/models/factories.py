from __future__ import annotations

from apps.models.choices import ModelKind
from apps.models.models import LlmModel, ModelVersion
from apps.models.services import llm_model_create, model_version_create


def make_model(
    name: str,
    *,
    max_context_tokens: int = 2048,
    version: str = "v1",
    kind: str = ModelKind.GENERATE,
    tool_call_parser: str = "",
    reasoning_parser: str = "",
    chat_template: str = "",
    **targets,
) -> tuple[LlmModel, ModelVersion]:
    """`targets`: sla_ttft_p95_ms, sla_latency_p95_ms; the parsers and chat template are the
    version's (when it is created here)."""
    model = LlmModel.objects.filter(name=name).first() or llm_model_create(
        name=name, max_context_tokens=max_context_tokens, kind=kind, **targets
    )
    existing = ModelVersion.objects.filter(model=model, tag=version).first()
    return model, existing or model_version_create(
        model=model,
        tag=version,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        chat_template=chat_template,
    )
