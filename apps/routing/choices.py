from django.db import models


class DecisionOutcome(models.TextChoices):
    ROUTED = "routed", "Routed"
    NO_CAPACITY = "no_capacity", "No node could serve"
    QUEUE_TIMEOUT = "queue_timeout", "Waited for capacity in vain"


class RecomputationStatus(models.TextChoices):
    PROPOSED = "proposed", "Proposed (waiting for approval)"
    APPLIED = "applied", "Applied"
    REJECTED = "rejected", "Rejected"


class CanaryAction(models.TextChoices):
    START = "start", "Started"
    STEP = "step", "Advanced a step"
    PROMOTE = "promote", "Promoted"
    ROLLBACK = "rollback", "Rolled back"


class ScalerBackend(models.TextChoices):
    LOCAL = "local", "Worker processes on this host"
    KUBERNETES = "kubernetes", "Kubernetes Deployment"


class ScalingAction(models.TextChoices):
    SCALE_OUT = "scale_out", "Scale out"
    SCALE_IN = "scale_in", "Scale in"
    HOLD = "hold", "Hold"


class ScalingTrigger(models.TextChoices):
    SCHEDULE = "schedule", "Periodic SLO evaluation"
    ALERTMANAGER = "alertmanager", "Alertmanager webhook"
    OPERATOR = "operator", "Operator"
