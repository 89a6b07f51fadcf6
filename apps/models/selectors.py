"""Reads of the model registry."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.models.catalog import Catalog, ModelEntry, VersionEntry
from apps.models.models import LlmModel, Tokenizer
from apps.models.tokenizers import PromptCounter


def llm_models_active() -> QuerySet[LlmModel]:
    """The models clients may name now, by name."""
    return LlmModel.objects.filter(is_active=True)


def tokenizer_exists(*, sha256: str) -> bool:
    return Tokenizer.objects.filter(sha256=sha256).exists()


def catalog_load(*, version: int, previous: Catalog | None = None) -> Catalog:
    """Build the catalog of active models; reuse tokenizers already loaded in `previous`."""
    known = previous.counters if previous else {}
    counters: dict[str, PromptCounter] = {}
    models: dict[str, ModelEntry] = {}
    queryset = LlmModel.objects.filter(is_active=True).prefetch_related("versions")
    for model in queryset:
        versions = [v for v in model.versions.all() if v.is_active]
        # The newest version that has a tokenizer counts the model's prompts.
        sha = next(
            (
                v.tokenizer_id
                for v in sorted(versions, key=lambda v: v.created_at, reverse=True)
                if v.tokenizer_id
            ),
            None,
        )
        counter = None
        if sha:
            counter = counters.get(sha) or known.get(sha)
            if counter is None:
                row = Tokenizer.objects.get(sha256=sha)
                counter = PromptCounter(
                    tokenizer_json=row.tokenizer_json,
                    chat_template=row.chat_template,
                    bos_token=row.bos_token,
                    eos_token=row.eos_token,
                )
            counters[sha] = counter
        models[model.name] = ModelEntry(
            id=model.id,
            name=model.name,
            owned_by=model.owned_by,
            kind=model.kind,
            created=int(model.created_at.timestamp()),
            max_context_tokens=model.max_context_tokens,
            versions={
                v.id: VersionEntry(
                    id=v.id,
                    tag=v.tag,
                    is_stable=v.is_stable,
                    canary_percent=float(v.canary_percent),
                )
                for v in versions
            },
            counter=counter,
            sla_ttft_p95_ms=model.sla_ttft_p95_ms,
            sla_latency_p95_ms=model.sla_latency_p95_ms,
        )
    return Catalog(version=version, models=models, counters=counters)
