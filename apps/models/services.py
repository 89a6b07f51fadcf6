"""Writes to the model registry, canaries' ramps and gates included. Every change bumps the
catalog version gateways watch."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.models.choices import ModelKind
from apps.models.errors import ModelsErrorCode
from apps.models.models import LlmModel, ModelVersion, Tokenizer
from dmxplatform.audit.entries import audited_update
from dmxplatform.errors import InvalidRequestError, NotFoundError
from dmxplatform.versioned import VersionCounter
from inference.wire import TokenizerUpload, tokenizer_digest

# Gateways rebuild their catalog when this moves (dispatcher.refresh).
CATALOG_VERSION = VersionCounter("catalog")


def catalog_invalidate() -> None:
    """Tell every gateway to rebuild its catalog once the current transaction commits."""
    CATALOG_VERSION.bump_on_commit()


def llm_model_create(
    *,
    name: str,
    max_context_tokens: int,
    description: str = "",
    owned_by: str = "dmx",
    sla_ttft_p95_ms: int | None = None,
    sla_latency_p95_ms: int | None = None,
    kind: str = ModelKind.GENERATE,
) -> LlmModel:
    model = LlmModel(
        name=name,
        kind=kind,
        max_context_tokens=max_context_tokens,
        description=description,
        owned_by=owned_by,
        sla_ttft_p95_ms=sla_ttft_p95_ms,
        sla_latency_p95_ms=sla_latency_p95_ms,
    )
    return llm_model_save(model=model)


def llm_model_save(*, model: LlmModel) -> LlmModel:
    """Create or change a model (the admin's form)."""
    model.full_clean()
    model.save()
    catalog_invalidate()
    return model


def llm_model_delete(*, model: LlmModel) -> None:
    """Delete a model with its versions."""
    model.delete()
    catalog_invalidate()


def model_version_create(
    *,
    model: LlmModel,
    tag: str,
    source: str = "",
    tool_call_parser: str = "",
    reasoning_parser: str = "",
    chat_template: str = "",
) -> ModelVersion:
    version = ModelVersion(
        model=model,
        tag=tag,
        source=source,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        chat_template=chat_template,
    )
    return model_version_save(version=version)


@transaction.atomic
def model_version_ensure(
    *,
    name: str,
    tag: str,
    max_context_tokens: int,
    kind: str = ModelKind.GENERATE,
    source: str = "",
    tool_call_parser: str = "",
) -> ModelVersion:
    """Create a model and its version where they are missing (a local setup's seed); give an
    existing version `tool_call_parser` only where it has none, keeping an operator's choice."""
    model = LlmModel.objects.filter(name=name).first() or llm_model_create(
        name=name, max_context_tokens=max_context_tokens, kind=kind
    )
    version = ModelVersion.objects.filter(model=model, tag=tag).first()
    if version is None:
        return model_version_create(
            model=model, tag=tag, source=source, tool_call_parser=tool_call_parser
        )
    if tool_call_parser and not version.tool_call_parser:
        version.tool_call_parser = tool_call_parser
        model_version_save(version=version)
    return version


def model_version_save(*, version: ModelVersion) -> ModelVersion:
    """Create or change a version (the admin's forms)."""
    version.full_clean()
    version.save()
    catalog_invalidate()
    return version


def model_version_delete(*, version: ModelVersion) -> None:
    version.delete()
    catalog_invalidate()


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


def tokenizer_delete(*, tokenizer: Tokenizer) -> None:
    """Delete a stored tokenizer; its versions count prompts without one until a worker that
    serves them uploads it again."""
    tokenizer.delete()
    catalog_invalidate()


# Canaries --------------------------------------------------------------------------------------
# A canary is a version taking a share of its model's traffic along a ramp, step by step; these
# change its fields. Judging a step on its traffic, and the canary's event log, are routing's
# (apps.routing.services.canary_evaluate), which calls these.

# Percentages are stored with two decimals (ModelVersion.canary_percent).
PERCENT = Decimal("0.01")
# A ramp longer than this is not a plan an operator follows step by step.
MAX_CANARY_STEPS = 20


@dataclass(frozen=True, slots=True)
class CanaryGates:
    """What each step of a canary's ramp must show to advance: at least `min_requests`
    served, an error rate at most `error_tolerance` above the stable versions', and a P95
    latency within `latency_p95_ms` (None once filled: the stable versions' P95 plus a tenth).

    A gate given as None is its default, which `filled` puts in: the one place defaults are.
    """

    min_requests: int | None = None
    error_tolerance: float | None = None
    latency_p95_ms: int | None = None

    def filled(self, model: LlmModel) -> CanaryGates:
        """These gates, each one not given taken from DMX_CANARY_MIN_REQUESTS,
        DMX_CANARY_ERROR_TOLERANCE or the model's latency SLA."""
        return CanaryGates(
            min_requests=(
                settings.DMX_CANARY_MIN_REQUESTS if self.min_requests is None else self.min_requests
            ),
            error_tolerance=(
                settings.DMX_CANARY_ERROR_TOLERANCE
                if self.error_tolerance is None
                else self.error_tolerance
            ),
            latency_p95_ms=(
                model.sla_latency_p95_ms if self.latency_p95_ms is None else self.latency_p95_ms
            ),
        )

    @classmethod
    def of(cls, version: ModelVersion) -> CanaryGates:
        """The gates a canary runs under: those it started with (model_version_canary_start
        stores them filled), the defaults for a canary started before there were gates."""
        stored = cls(
            min_requests=version.canary_min_requests,
            error_tolerance=version.canary_error_tolerance,
            latency_p95_ms=version.canary_latency_p95_ms,
        )
        return stored.filled(version.model)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _ramp(percent: Decimal | float, steps: Sequence[Decimal | float]) -> list[Decimal]:
    first, *rest = (Decimal(str(p)) for p in (percent, *steps))

    def share(p: Decimal) -> bool:
        return p.is_finite() and 0 < p <= 100

    if not share(first):
        raise ValidationError({"percent": "A canary takes more than 0% and at most 100%."})
    if len(rest) >= MAX_CANARY_STEPS:
        raise ValidationError({"steps": f"At most {MAX_CANARY_STEPS - 1} steps after the first."})
    ramp = [p.quantize(PERCENT) for p in (first, *rest) if share(p)]
    if len(ramp) != 1 + len(rest) or any(b <= a for a, b in itertools.pairwise(ramp)):
        raise ValidationError(
            {"steps": "Each step takes more than the one before it, up to 100%, e.g. 25, 50, 100."}
        )
    return ramp


def model_version_lock(*, version_id: int) -> ModelVersion:
    """The version as it is now, its row locked until the transaction ends: a canary's
    start, evaluation, promotion and rollback each judge it on this, one at a time."""
    return (
        ModelVersion.objects.select_for_update(of=("self",))
        .select_related("model")
        .get(id=version_id)
    )


def _canary_locked(version_id: int) -> ModelVersion:
    """The version locked (model_version_lock), refused unless it is still a canary: another
    operator or an evaluation may have promoted or rolled it back since the caller read it."""
    locked = model_version_lock(version_id=version_id)
    if not locked.is_canary:
        raise ValidationError({"version": f"{locked} is no longer a canary."})
    return locked


@transaction.atomic
def model_version_canary_start(
    *,
    version: ModelVersion,
    percent: Decimal | float,
    steps: Sequence[Decimal | float] = (),
    gates: CanaryGates | None = None,
) -> ModelVersion:
    """Send `percent` of the model's traffic to a version, then each of `steps` in turn as the
    previous one passes its gates (model_version_canary_advance); a gate not given is its
    default (CanaryGates.filled), stored with the others so that the canary keeps the gates it
    started with.
    """
    ramp = _ramp(percent, steps)
    version = model_version_lock(version_id=version.id)
    if version.is_canary:
        raise ValidationError({"version": f"{version} is a canary already."})
    others = ModelVersion.objects.filter(model=version.model, is_stable=True, is_active=True)
    if not others.exclude(id=version.id).exists():
        raise ValidationError(
            {"version": f"{version.model} has no other stable version to take the rest."}
        )
    gates = (gates or CanaryGates()).filled(version.model)
    moment = timezone.now()
    version.is_stable = False
    version.canary_percent = ramp[0]
    version.canary_steps = [float(p) for p in ramp]
    version.canary_step = 0
    version.canary_started_at = version.canary_step_started_at = moment
    version.canary_min_requests = gates.min_requests
    version.canary_error_tolerance = gates.error_tolerance
    version.canary_latency_p95_ms = gates.latency_p95_ms
    version.full_clean()
    version.save(
        update_fields=[
            "is_stable",
            "canary_percent",
            "canary_steps",
            "canary_step",
            "canary_started_at",
            "canary_step_started_at",
            "canary_min_requests",
            "canary_error_tolerance",
            "canary_latency_p95_ms",
        ]
    )
    catalog_invalidate()
    return version


@transaction.atomic
def model_version_canary_advance(*, version: ModelVersion) -> ModelVersion:
    """Move a canary to its ramp's next step, whose share it takes from now (a 400 if it is no
    longer a canary, or is at its last step: the next move is a promotion)."""
    version = _canary_locked(version.id)
    if version.canary_last_step:
        raise ValidationError({"version": f"{version} is at the last step of its ramp."})
    version.canary_step += 1
    version.canary_percent = Decimal(str(version.canary_steps[version.canary_step]))
    version.canary_step_started_at = timezone.now()
    version.save(update_fields=["canary_step", "canary_percent", "canary_step_started_at"])
    catalog_invalidate()
    return version


@transaction.atomic
def model_version_canary_promote(*, version: ModelVersion) -> ModelVersion:
    """Make a canary the model's only stable version (a 400 if it is no longer a canary)."""
    version = _canary_locked(version.id)
    audited_update(
        ModelVersion.objects.filter(model=version.model, is_stable=True).exclude(id=version.id),
        is_stable=False,
    )
    version.is_stable = True
    version.canary_percent = 0
    version.save(update_fields=["is_stable", "canary_percent"])
    catalog_invalidate()
    return version


@transaction.atomic
def model_version_canary_rollback(*, version: ModelVersion) -> ModelVersion:
    """Take all traffic off a canary; its nodes stay up for an operator to inspect (a 400 if
    it is no longer a canary)."""
    version = _canary_locked(version.id)
    version.canary_percent = 0
    version.save(update_fields=["canary_percent"])
    catalog_invalidate()
    return version
