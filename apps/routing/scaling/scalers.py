"""The scaler interface, and the scaler a policy's backend names."""

from __future__ import annotations

from typing import Protocol

from apps.routing.choices import ScalerBackend
from apps.routing.models import ScalingPolicy
from apps.routing.scaling.errors import ScalingError, ScalingErrorCode
from apps.routing.scaling.local import LocalProcessScaler, arguments_problem


class Scaler(Protocol):
    """Reads and sets how many workers serve one model."""

    def current_replicas(self) -> int:
        """Return the replicas wanted now (alive, not being stopped)."""
        ...

    def scale_to(self, replicas: int) -> None:
        """Make `replicas` workers serve the model; raise ScalingError when that fails."""
        ...


def policy_problems(policy: ScalingPolicy) -> dict[str, str]:
    """Return what keeps the policy's backend from working, by field name."""
    problems: dict[str, str] = {}
    if policy.backend == ScalerBackend.KUBERNETES:
        for field in ("kubernetes_namespace", "kubernetes_deployment"):
            if not getattr(policy, field):
                problems[field] = "Required for the Kubernetes backend."
        return problems
    problem = arguments_problem(policy.worker_arguments, model=policy.model.name)
    if problem:
        problems["worker_arguments"] = problem
    return problems


def scaler_for(policy: ScalingPolicy) -> Scaler:
    """Return the scaler of the policy's backend; raise ScalingError when it is misconfigured."""
    problems = policy_problems(policy)
    if problems:
        field, message = next(iter(problems.items()))
        raise ScalingError(
            f"Scaling policy of {policy.model.name}: {field}: {message}",
            code=ScalingErrorCode.POLICY_MISCONFIGURED,
            param=field,
        )
    if policy.backend == ScalerBackend.KUBERNETES:
        # Imported here: only processes that scale a Deployment pay for the client's import.
        from apps.routing.scaling.kubernetes import KubernetesScaler

        return KubernetesScaler.from_policy(policy)
    return LocalProcessScaler.from_policy(policy)
