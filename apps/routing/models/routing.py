"""The routing table, the decision log, weight recomputations and canary events."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from apps.keys.choices import PriorityTier
from apps.models.models import LlmModel, ModelVersion
from apps.routing.choices import CanaryAction, DecisionOutcome, RecomputationStatus


class RoutingRule(models.Model):
    """For an alias (e.g. "auto") and an intent, a model to send requests to, with a weight.

    A request for the alias is resolved with the rules of its intent (or the alias's
    intent-free rules when there are none), choosing among their models in proportion to the
    weights; the hardware preference then favours nodes of those profiles. A rule's tier, when
    it has one, can only lower the priority tier of the requests it routes (table.Route.tier).
    """

    alias = models.SlugField(max_length=64)
    intent = models.CharField(max_length=32, blank=True, help_text="Empty: any intent.")
    model = models.ForeignKey(LlmModel, on_delete=models.CASCADE, related_name="routing_rules")
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    hardware_preference = models.JSONField(
        default=list,
        blank=True,
        help_text='Hardware profile names to prefer, e.g. ["nvidia-h100-sxm"].',
    )
    tier = models.PositiveSmallIntegerField(
        choices=PriorityTier.choices,
        null=True,
        blank=True,
        help_text="Empty: the key's tier. Else the requests this rule routes run at the lower of "
        "this tier and their key's (e.g. summarization at Batch).",
    )
    is_active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["alias", "intent", "-weight"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias", "intent", "model"], name="routing_rule_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.alias}/{self.intent or '*'} -> {self.model.name} ({self.weight:g})"


class RoutingDecision(models.Model):
    """One routing decision with every candidate's filter verdicts and scores."""

    request_id = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    requested_model = models.CharField(max_length=128)
    model = models.CharField(max_length=128)
    intent = models.CharField(max_length=32, blank=True)
    intent_confidence = models.FloatField(
        null=True, blank=True, help_text="The classifier's calibrated probability for the intent."
    )
    intent_low_confidence = models.BooleanField(
        default=False,
        help_text="The confidence was under DMX_INTENT_MIN_CONFIDENCE: an alias routed it by "
        "its default route.",
    )
    priority = models.PositiveSmallIntegerField(default=1)
    outcome = models.CharField(max_length=16, choices=DecisionOutcome.choices)
    chosen_node = models.CharField(max_length=128, blank=True)
    chosen_version = models.CharField(max_length=64, blank=True)
    candidates = models.JSONField(default=list)
    waited_ms = models.FloatField(default=0.0, help_text="Time in the admission queue.")
    decision_us = models.FloatField(default=0.0, help_text="Time the decision itself took.")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["created_at"], name="routing_decision_time_idx")]

    def __str__(self) -> str:
        return self.request_id


class WeightRecomputation(models.Model):
    """A nightly recomputation of the routing table's weights, with what changed and why."""

    created_at = models.DateTimeField(auto_now_add=True)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    status = models.CharField(max_length=16, choices=RecomputationStatus.choices)
    changes = models.JSONField(
        default=list, help_text="Per rule: old and new weight and the figures behind them."
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d} ({self.status})"


class WorkProfile(models.Model):
    """What a model's requests of an intent (and one key's, with enough history) generated and
    how long they took, over the ledger's window: the router predicts decode work from it
    (apps.routing.work). Recomputed as a whole by work_profiles_recompute."""

    model = models.CharField(max_length=128)
    intent = models.CharField(max_length=32, blank=True, help_text="Empty: every intent.")
    api_key = models.ForeignKey(
        "keys.ApiKey",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        help_text="Empty: every key.",
    )
    requests = models.PositiveIntegerField()
    completion_p50 = models.PositiveIntegerField(help_text="Completion tokens, median.")
    completion_p95 = models.PositiveIntegerField()
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p95_ms = models.FloatField(null=True, blank=True)
    latency_p50_ms = models.FloatField(null=True, blank=True)
    latency_p95_ms = models.FloatField(null=True, blank=True)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["model", "intent", "api_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "intent", "api_key"],
                nulls_distinct=False,
                name="routing_work_profile_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.model}/{self.intent or '*'}" + (
            f"/key {self.api_key_id}" if self.api_key_id else ""
        )


class CanaryEvent(models.Model):
    """A canary version promoted or rolled back, with the figures that decided it."""

    version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="canary_events"
    )
    action = models.CharField(max_length=16, choices=CanaryAction.choices)
    automatic = models.BooleanField(default=True)
    figures = models.JSONField(default=dict)
    operator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.version} {self.action}"
