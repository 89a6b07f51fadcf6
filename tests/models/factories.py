from __future__ import annotations

from decimal import Decimal

from apps.billing.services import price_set
from apps.models.choices import ModelKind
from apps.models.models import LlmModel, ModelVersion
from apps.models.services import llm_model_create, model_version_create

# A small model's prices per million tokens (input, cached input, output), in DMX_CURRENCY.
TEST_PRICES = ("0.150000", "0.075000", "0.600000")


def make_model(
    name: str,
    *,
    max_context_tokens: int = 2048,
    version: str = "v1",
    kind: str = ModelKind.GENERATE,
    tool_call_parser: str = "",
    reasoning_parser: str = "",
    chat_template: str = "",
    prices: tuple[str, str, str] | None = TEST_PRICES,
    **targets,
) -> tuple[LlmModel, ModelVersion]:
    """`targets`: sla_ttft_p95_ms, sla_latency_p95_ms; the parsers and chat template are the
    version's (when it is created here), and so are `prices` (input, cached input, output per
    million tokens, from now; None: the version stays unpriced)."""
    model = LlmModel.objects.filter(name=name).first() or llm_model_create(
        name=name, max_context_tokens=max_context_tokens, kind=kind, **targets
    )
    existing = ModelVersion.objects.filter(model=model, tag=version).first()
    if existing is not None:
        return model, existing
    created = model_version_create(
        model=model,
        tag=version,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        chat_template=chat_template,
    )
    if prices is not None:
        price_set(
            model_version_id=created.id,
            input_per_million=Decimal(prices[0]),
            cached_input_per_million=Decimal(prices[1]),
            output_per_million=Decimal(prices[2]),
        )
    return model, created
