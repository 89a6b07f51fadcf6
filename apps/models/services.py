"""Writes to the model registry. Every change bumps the catalog version gateways watch."""

from __future__ import annotations

from django.db import transaction

from apps.models.errors import ModelsErrorCode
from apps.models.models import LlmModel, ModelVersion, Tokenizer
from dmxplatform.errors import InvalidRequestError, NotFoundError
from dmxplatform.redis_client import rkey, sync_redis
from inference.wire import TokenizerUpload, tokenizer_digest

CATALOG_VERSION_KEY = ("catalog", "version")


def catalog_invalidate() -> None:
    """Tell every gateway to rebuild its catalog once the current transaction commits."""
    transaction.on_commit(lambda: sync_redis().incr(rkey(*CATALOG_VERSION_KEY)))


def llm_model_create(
    *,
    name: str,
    max_context_tokens: int,
    description: str = "",
    owned_by: str = "dmx",
    sla_ttft_p95_ms: int | None = None,
    sla_latency_p95_ms: int | None = None,
) -> LlmModel:
    model = LlmModel(
        name=name,
        max_context_tokens=max_context_tokens,
        description=description,
        owned_by=owned_by,
        sla_ttft_p95_ms=sla_ttft_p95_ms,
        sla_latency_p95_ms=sla_latency_p95_ms,
    )
    model.full_clean()
    model.save()
    catalog_invalidate()
    return model


def model_version_create(*, model: LlmModel, tag: str, source: str = "") -> ModelVersion:
    version = ModelVersion(model=model, tag=tag, source=source)
    version.full_clean()
    version.save()
    catalog_invalidate()
    return version


def model_version_find(*, model_name: str, tag: str) -> ModelVersion:
    """Return the active version a node says it serves, or raise NotFoundError."""
    try:
        return ModelVersion.objects.select_related("model").get(
            model__name=model_name, model__is_active=True, tag=tag, is_active=True
        )
    except ModelVersion.DoesNotExist:
        raise NotFoundError(
            f"Model version {model_name}@{tag} is not registered; operators add it in the admin.",
            code=ModelsErrorCode.VERSION_NOT_FOUND,
            param="version",
        ) from None


def model_version_attach_tokenizer(*, version: ModelVersion, sha256: str) -> bool:
    """Link a version to a stored tokenizer; return False when that tokenizer is not stored."""
    if version.tokenizer_id == sha256:
        return True
    if not Tokenizer.objects.filter(sha256=sha256).exists():
        return False
    version.tokenizer_id = sha256
    version.save(update_fields=["tokenizer"])
    catalog_invalidate()
    return True


def tokenizer_store(*, sha256: str, upload: TokenizerUpload) -> Tokenizer:
    """Store a tokenizer under its content hash; a hash that does not match is refused."""
    if tokenizer_digest(upload) != sha256:
        raise InvalidRequestError(
            "The tokenizer's content does not match the hash in the URL.",
            code=ModelsErrorCode.TOKENIZER_MISMATCH,
        )
    tokenizer, _ = Tokenizer.objects.get_or_create(
        sha256=sha256,
        defaults={
            "tokenizer_json": upload.tokenizer_json,
            "chat_template": upload.chat_template,
            "bos_token": upload.bos_token,
            "eos_token": upload.eos_token,
        },
    )
    return tokenizer
