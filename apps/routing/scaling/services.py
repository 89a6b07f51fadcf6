"""Writes for autoscaling: evaluate a policy and scale its model; take Alertmanager's alerts."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from apps.routing.choices import ScalingAction, ScalingTrigger
from apps.routing.models import ScalingEvent, ScalingPolicy
from apps.routing.scaling.errors import ScalingError, ScalingErrorCode
from apps.routing.scaling.scalers import scaler_for
from apps.routing.scaling.selectors import scaling_figures, scaling_policy_for_model
from apps.routing.scaling.slo import Decision, decide, judge
from dmxplatform.errors import ApplicationError, ConflictError, NotFoundError

logger = logging.getLogger(__name__)

# ScalingEvent.reason's length.
REASON_MAX = 255
# The alert label that names the model an alert is about.
MODEL_LABEL = "model"


def scaling_evaluate(
    *,
    policy_id: int,
    trigger: ScalingTrigger,
    now: datetime | None = None,
    alert: str | None = None,
) -> ScalingEvent:
    """Measure a model against its SLO and queue target, decide with hysteresis, and scale.

    `now` places the latency window and the cooldown (live node state is always read as of
    now); `alert` names a firing alert, which counts as a sustained breach (see slo.decide).
    The policy row stays locked from reading its counters to saving them, the scaler's call
    included, so two Celery workers (or the beat and a webhook) never decide for one model at
    once. Returns the event; it is saved only when it is worth keeping: a change, a failed
    change, or a hold while breaching.
    """
    moment = now or timezone.now()
    with transaction.atomic():
        policy = (
            ScalingPolicy.objects.select_for_update(of=("self",))
            .select_related("model")
            .filter(pk=policy_id)
            .first()
        )
        if policy is None:
            raise NotFoundError(
                f"No scaling policy {policy_id}.", code=ScalingErrorCode.POLICY_NOT_FOUND
            )
        if not policy.is_active:
            raise ConflictError(
                f"The scaling policy of {policy.model.name} is inactive.",
                code=ScalingErrorCode.POLICY_INACTIVE,
            )
        scaler = scaler_for(policy)
        current = scaler.current_replicas()
        figures = scaling_figures(policy=policy, now=moment)
        judgement = judge(figures, alert=alert)
        decision = decide(
            policy, judgement=judgement, current=current, now=moment, alert=alert is not None
        )
        error = None
        if decision.action != ScalingAction.HOLD:
            try:
                scaler.scale_to(decision.to_replicas)
            except ScalingError as exc:
                logger.warning(
                    "%s: %s to %s failed: %s", scaler, decision.action, decision.to_replicas, exc
                )
                error = exc.message
                decision = _failed(policy, decision, current=current, error=error)
            else:
                policy.last_scaled_at = moment
        policy.consecutive_breaches = decision.consecutive_breaches
        policy.consecutive_calm = decision.consecutive_calm
        policy.save(update_fields=["consecutive_breaches", "consecutive_calm", "last_scaled_at"])
        event = ScalingEvent(
            policy=policy,
            trigger=trigger,
            action=decision.action,
            from_replicas=current,
            to_replicas=decision.to_replicas,
            reason=decision.reason[:REASON_MAX],
            figures={
                **figures.as_json(),
                "verdict": judgement.verdict,
                "reasons": judgement.reasons,
                "consecutive_breaches": decision.consecutive_breaches,
                "consecutive_calm": decision.consecutive_calm,
                "alert": alert,
                "error": error,
            },
        )
        if decision.record:
            event.full_clean()
            event.save()
    return event


def _failed(policy: ScalingPolicy, decision: Decision, *, current: int, error: str) -> Decision:
    """Hold after a failed change, keeping the count that called for it: the next one retries."""
    out = decision.action == ScalingAction.SCALE_OUT
    return Decision(
        action=ScalingAction.HOLD,
        to_replicas=current,
        consecutive_breaches=policy.breaches_to_scale_out if out else 0,
        consecutive_calm=0 if out else policy.calm_to_scale_in,
        reason=f"{decision.action} to {decision.to_replicas} failed: {error}",
        record=True,
    )


@dataclass(frozen=True)
class AlertmanagerAlert:
    """One alert of an Alertmanager notification (webhook payload version 4)."""

    status: str  # "firing" or "resolved"
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    starts_at: datetime | None = None
    ends_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "unnamed")

    @property
    def model(self) -> str | None:
        return self.labels.get(MODEL_LABEL) or None

    @property
    def firing(self) -> bool:
        return self.status == "firing"


def scaling_alert_resolved_record(
    *, policy: ScalingPolicy, alert: AlertmanagerAlert
) -> ScalingEvent:
    """Record that an alert about the policy's model resolved; scaling is left to the SLO."""
    replicas = scaler_for(policy).current_replicas()
    event = ScalingEvent(
        policy=policy,
        trigger=ScalingTrigger.ALERTMANAGER,
        action=ScalingAction.HOLD,
        from_replicas=replicas,
        to_replicas=replicas,
        reason=f"alert {alert.name} resolved"[:REASON_MAX],
        figures={
            "alert": alert.name,
            "labels": alert.labels,
            "starts_at": alert.starts_at.isoformat() if alert.starts_at else None,
            "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
        },
    )
    event.full_clean()
    event.save()
    return event


def alertmanager_alerts_handle(*, alerts: Sequence[AlertmanagerAlert]) -> list[dict[str, object]]:
    """Evaluate at once the policy of every model a firing alert names; record resolved alerts.

    Several firing alerts about one model make one evaluation, not one scale-out each.
    Returns one outcome per alert, in order.
    """
    models = {alert.model for alert in alerts if alert.model}
    policies = {model: scaling_policy_for_model(model_name=model) for model in models}
    firing: defaultdict[str, list[str]] = defaultdict(list)
    for alert in alerts:
        if alert.firing and alert.model and policies[alert.model]:
            firing[alert.model].append(alert.name)
    evaluations = {
        model: _evaluate_for_alerts(policies[model], names) for model, names in firing.items()
    }
    return [_alert_outcome(alert, policies, evaluations) for alert in alerts]


def _evaluate_for_alerts(policy: ScalingPolicy, names: list[str]) -> dict[str, object]:
    try:
        event = scaling_evaluate(
            policy_id=policy.id, trigger=ScalingTrigger.ALERTMANAGER, alert=", ".join(names)
        )
    except ApplicationError as exc:
        logger.warning("evaluation for alerts %s failed: %s", names, exc)
        return {"outcome": "failed", **exc.to_dict()}
    return _described(event, "evaluated")


def _alert_outcome(
    alert: AlertmanagerAlert,
    policies: dict[str, ScalingPolicy | None],
    evaluations: dict[str, dict[str, object]],
) -> dict[str, object]:
    head = {"alert": alert.name, "status": alert.status, "model": alert.model}
    policy = policies.get(alert.model) if alert.model else None
    if not alert.model:
        return {**head, "outcome": "ignored", "reason": f"no {MODEL_LABEL} label"}
    if policy is None:
        return {**head, "outcome": "ignored", "reason": "no active scaling policy"}
    if alert.firing:
        return {**head, **evaluations[alert.model]}
    try:
        event = scaling_alert_resolved_record(policy=policy, alert=alert)
    except ApplicationError as exc:
        logger.warning("recording resolved alert %s failed: %s", alert.name, exc)
        return {**head, "outcome": "failed", **exc.to_dict()}
    return {**head, **_described(event, "recorded")}


def _described(event: ScalingEvent, outcome: str) -> dict[str, object]:
    return {
        "outcome": outcome,
        "event_id": event.pk,
        "action": event.action,
        "from_replicas": event.from_replicas,
        "to_replicas": event.to_replicas,
        "reason": event.reason,
    }
