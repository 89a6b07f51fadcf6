"""Celery tasks of autoscaling.

The beat's task fans out one task per policy rather than looping: a Kubernetes API server that
hangs or a worker that will not start delays and fails that model's evaluation only, each under
its own time limit, while the policy's row lock keeps two evaluations of one model apart.
"""

from celery import shared_task
from django.conf import settings

from apps.routing.choices import ScalingTrigger
from apps.routing.scaling.selectors import scaling_policy_ids_active
from apps.routing.scaling.services import scaling_evaluate
from dmxplatform.queues import Queue


@shared_task(queue=Queue.FLEET, time_limit=30, soft_time_limit=20, ignore_result=True)
def slo_evaluate_task() -> int:
    """Queue one evaluation per active scaling policy; return how many."""
    policy_ids = scaling_policy_ids_active()
    for policy_id in policy_ids:
        # One that waited a whole period in the queue is superseded by the next round.
        scaling_evaluate_task.apply_async(
            kwargs={"policy_id": policy_id}, expires=settings.DMX_SLO_EVALUATION_SECONDS
        )
    return len(policy_ids)


# Two Kubernetes calls of DMX_KUBERNETES_TIMEOUT_SECONDS (10 s) each, plus two short queries.
@shared_task(queue=Queue.FLEET, time_limit=60, soft_time_limit=45, ignore_result=True)
def scaling_evaluate_task(*, policy_id: int) -> str:
    """Evaluate one policy on the beat's schedule; return the action taken."""
    return scaling_evaluate(policy_id=policy_id, trigger=ScalingTrigger.SCHEDULE).action
