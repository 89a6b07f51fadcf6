"""Autoscaling: a policy per model and the log of what it decided."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from apps.models.models import LlmModel
from apps.routing.choices import ScalerBackend, ScalingAction, ScalingTrigger


class ScalingPolicy(models.Model):
    """How many workers a model should have, and when to change that.

    Scale out after `breaches_to_scale_out` consecutive evaluations over the SLO (P95 latency
    over the last five minutes against the model's target) or over the queue target; scale in
    after `calm_to_scale_in` consecutive evaluations well under both; never twice within
    `cooldown_seconds`. The asymmetry is the hysteresis that keeps the count from flapping.
    """

    model = models.OneToOneField(LlmModel, on_delete=models.CASCADE, related_name="scaling_policy")
    backend = models.CharField(
        max_length=16, choices=ScalerBackend.choices, default=ScalerBackend.LOCAL
    )
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    target_queue_per_node = models.FloatField(
        default=4.0,
        help_text="Waiting requests per node above which the model is short of capacity.",
    )
    breaches_to_scale_out = models.PositiveIntegerField(
        default=2, validators=[MinValueValidator(1)]
    )
    calm_to_scale_in = models.PositiveIntegerField(default=5, validators=[MinValueValidator(1)])
    cooldown_seconds = models.PositiveIntegerField(default=120)
    kubernetes_namespace = models.CharField(max_length=128, blank=True)
    kubernetes_deployment = models.CharField(max_length=128, blank=True)
    worker_arguments = models.JSONField(
        default=list,
        blank=True,
        help_text="For the local backend: the worker's arguments (python -m inference.worker …).",
    )
    is_active = models.BooleanField(default=True)
    # State carried between evaluations.
    consecutive_breaches = models.PositiveIntegerField(default=0, editable=False)
    consecutive_calm = models.PositiveIntegerField(default=0, editable=False)
    last_scaled_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name_plural = "scaling policies"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(min_replicas__lte=models.F("max_replicas")),
                name="scaling_policy_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}: {self.min_replicas}-{self.max_replicas} ({self.backend})"


class ScalingEvent(models.Model):
    policy = models.ForeignKey(ScalingPolicy, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    trigger = models.CharField(max_length=16, choices=ScalingTrigger.choices)
    action = models.CharField(max_length=16, choices=ScalingAction.choices)
    from_replicas = models.PositiveIntegerField()
    to_replicas = models.PositiveIntegerField()
    reason = models.CharField(max_length=255)
    figures = models.JSONField(default=dict)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.policy.model.name} {self.action} {self.from_replicas}->{self.to_replicas}"
