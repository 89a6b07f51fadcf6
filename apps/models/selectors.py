"""Reads of the model registry."""

from __future__ import annotations

import hashlib

from django.db.models import QuerySet

from apps.models.catalog import Catalog, ModelEntry, VersionEntry
from apps.models.errors import ModelsErrorCode
from apps.models.models import LlmModel, ModelVersion, Tokenizer
from apps.models.tokenizers import PromptCounter
from dmxplatform.errors import NotFoundError
from inference.wire import EngineSettings


def llm_models_active() -> QuerySet[LlmModel]:
    """The models clients may name now, by name."""
    return LlmModel.objects.filter(is_active=True)


def tokenizer_exists(*, sha256: str) -> bool:
    return Tokenizer.objects.filter(sha256=sha256).exists()


def model_version_engine_settings(*, model_name: str, tag: str) -> EngineSettings:
    """What the engine serving an active version starts with; NotFoundError (404) when there
    is no such version, as registration answers."""
    version = (
        ModelVersion.objects.select_related("model")
        .filter(model__name=model_name, model__is_active=True, tag=tag, is_active=True)
        .first()
    )
    if version is None:
        raise NotFoundError(
            f"Model version {model_name}@{tag} is not registered; operators add it in the admin.",
            code=ModelsErrorCode.VERSION_NOT_FOUND,
            param="version",
        )
    return EngineSettings(
        kind=version.model.kind,
        tool_call_parser=version.tool_call_parser or None,
        reasoning_parser=version.reasoning_parser or None,
        chat_template=version.chat_template or None,
    )


def _counter_key(sha256: str, chat_template: str) -> str:
    """A counter's key: its tokenizer's hash, and its template's where a version overrides it."""
    if not chat_template:
        return sha256
    return f"{sha256}+{hashlib.sha256(chat_template.encode()).hexdigest()}"


def catalog_load(*, version: int, previous: Catalog | None = None) -> Catalog:
    """Build the catalog of active models; reuse tokenizers already loaded in `previous`."""
    known = previous.counters if previous else {}
    counters: dict[str, PromptCounter] = {}
    models: dict[str, ModelEntry] = {}
    queryset = LlmModel.objects.filter(is_active=True).prefetch_related("versions")
    for model in queryset:
        versions = [v for v in model.versions.all() if v.is_active]
        # The newest version that has a tokenizer counts the model's prompts, with its own chat
        # template where it overrides the tokenizer's (its engine renders with that one).
        counting = next(
            (
                v
                for v in sorted(versions, key=lambda v: v.created_at, reverse=True)
                if v.tokenizer_id
            ),
            None,
        )
        counter = None
        if counting is not None:
            key = _counter_key(counting.tokenizer_id, counting.chat_template)
            counter = counters.get(key) or known.get(key)
            if counter is None:
                row = Tokenizer.objects.get(sha256=counting.tokenizer_id)
                counter = PromptCounter(
                    tokenizer_json=row.tokenizer_json,
                    chat_template=counting.chat_template or row.chat_template,
                    bos_token=row.bos_token,
                    eos_token=row.eos_token,
                )
            counters[key] = counter
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
