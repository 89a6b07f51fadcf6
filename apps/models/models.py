"""The model registry: public models, their versions, and the tokenizers that count their tokens."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from apps.models.choices import ModelKind
from apps.models.engine_settings import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    chat_template_error,
    parser_error,
)

# Public model ids travel in URLs and JSON; keep them to the characters OpenAI and vLLM use.
MODEL_NAME_VALIDATOR = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
    "Use letters, digits and . _ : / - (at most 128 characters).",
)


class Tokenizer(models.Model):
    """A model's tokenizer, uploaded by the first worker that serves it; keyed by content hash."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    tokenizer_json = models.TextField(help_text="The Hugging Face tokenizer.json.")
    chat_template = models.TextField(blank=True, help_text="Jinja chat template, if any.")
    bos_token = models.CharField(max_length=64, blank=True)
    eos_token = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.sha256[:12]


class LlmModel(models.Model):
    """A model as clients name it in the `model` field."""

    name = models.CharField(max_length=128, unique=True, validators=[MODEL_NAME_VALIDATOR])
    description = models.CharField(max_length=255, blank=True)
    owned_by = models.CharField(max_length=64, default="dmx")
    kind = models.CharField(max_length=16, choices=ModelKind.choices, default=ModelKind.GENERATE)
    max_context_tokens = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Prompt plus completion tokens the model accepts.",
    )
    sla_ttft_p95_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="Target P95 time to first token, ms (streams)."
    )
    sla_latency_p95_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="Target P95 end-to-end latency, ms."
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "LLM model"

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One set of weights of a model; nodes serve versions."""

    model = models.ForeignKey(LlmModel, on_delete=models.CASCADE, related_name="versions")
    tag = models.CharField(max_length=64, validators=[MODEL_NAME_VALIDATOR])
    source = models.CharField(
        max_length=512, blank=True, help_text="Weights: a local directory or a hub id."
    )
    tokenizer = models.ForeignKey(
        Tokenizer, on_delete=models.SET_NULL, null=True, blank=True, related_name="versions"
    )
    is_stable = models.BooleanField(
        default=True, help_text="Stable versions share the traffic canaries do not take."
    )
    canary_percent = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=0,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Share of the model's requests this version takes as a canary, 0-100.",
    )
    canary_started_at = models.DateTimeField(null=True, blank=True)
    # A canary's ramp and gates, set when it starts (apps.routing.services.canary_start, which
    # stores a gate not given as its default) and read by each evaluation; a gate empty here
    # (a canary started before gates existed) is read as its default (CanaryGates.of).
    canary_steps = models.JSONField(
        default=list,
        blank=True,
        help_text="The ramp: the percentages the canary takes step by step, e.g. [5, 25, 50, 100].",
    )
    canary_step = models.PositiveSmallIntegerField(
        default=0, help_text="The ramp's current step, counted from 0."
    )
    canary_step_started_at = models.DateTimeField(null=True, blank=True)
    canary_min_requests = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Gate: requests a step serves before it is judged.",
    )
    canary_error_tolerance = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="Gate: how far the canary's error rate may exceed the stable versions', 0-1.",
    )
    canary_latency_p95_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Gate: the P95 latency bound, ms; empty: the stable versions' P95 plus a tenth.",
    )
    # What the version's workers start vLLM with (inference.worker fetches them first).
    tool_call_parser = models.CharField(
        max_length=64,
        blank=True,
        help_text="vLLM's --tool-call-parser for this model's output (e.g. hermes, "
        "llama3_json); empty: requests with tool_choice auto, required or a named tool are "
        "refused.",
    )
    reasoning_parser = models.CharField(
        max_length=64,
        blank=True,
        help_text="vLLM's --reasoning-parser (e.g. qwen3, deepseek_r1); empty: none.",
    )
    chat_template = models.TextField(
        blank=True,
        help_text="A Jinja chat template used instead of the tokenizer's, by the engine and "
        "by the gateway's token counts; empty: the tokenizer's.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model__name", "tag"]
        constraints = [
            models.UniqueConstraint(fields=["model", "tag"], name="model_version_unique_tag"),
            models.CheckConstraint(
                condition=~(models.Q(is_stable=True) & models.Q(canary_percent__gt=0)),
                name="model_version_stable_or_canary",
            ),
        ]

    def clean(self) -> None:
        errors = {
            "tool_call_parser": parser_error(
                self.tool_call_parser, TOOL_CALL_PARSERS, "--tool-call-parser"
            ),
            "reasoning_parser": parser_error(
                self.reasoning_parser, REASONING_PARSERS, "--reasoning-parser"
            ),
            "chat_template": chat_template_error(self.chat_template),
        }
        errors = {name: message for name, message in errors.items() if message}
        if errors:
            raise ValidationError(errors)

    @property
    def is_canary(self) -> bool:
        return not self.is_stable and self.canary_percent > 0

    @property
    def canary_last_step(self) -> bool:
        """The ramp's current step is its last: passing it promotes the canary."""
        return self.canary_step + 1 >= len(self.canary_steps)

    def __str__(self) -> str:
        return f"{self.model.name}@{self.tag}"
