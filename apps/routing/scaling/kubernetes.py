"""A scaler that sets the replica count of a Kubernetes Deployment through its scale subresource.

Only the scale subresource is touched (GET and PATCH .../deployments/{name}/scale), so the
platform's service account needs no more than `get` and `patch` on `deployments/scale`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from apps.routing.models import ScalingPolicy
from apps.routing.scaling.errors import ScalingError, ScalingErrorCode

# A JSON merge patch is what `kubectl scale` amounts to; carrying the resourceVersion we read
# makes the API server refuse it (409) when someone else changed the count in between.
MERGE_PATCH = "application/merge-patch+json"


def kubernetes_configuration() -> client.Configuration:
    """Return the client configuration the settings describe (see dmxplatform/settings/scaling)."""
    configuration = client.Configuration()
    try:
        if settings.DMX_KUBECONFIG:
            # persist_config=False: a refreshed token must not be written into the operator's file.
            config.load_kube_config(
                config_file=settings.DMX_KUBECONFIG,
                client_configuration=configuration,
                persist_config=False,
            )
        elif not settings.DMX_KUBERNETES_HOST:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise ScalingError(
            f"No Kubernetes configuration: {exc}", code=ScalingErrorCode.POLICY_MISCONFIGURED
        ) from exc
    if settings.DMX_KUBERNETES_HOST:
        configuration.host = settings.DMX_KUBERNETES_HOST.rstrip("/")
    return configuration


class KubernetesScaler:
    """Reads and patches `spec.replicas` of one Deployment's scale subresource."""

    def __init__(
        self,
        *,
        namespace: str,
        deployment: str,
        configuration: client.Configuration,
        timeout: float,
    ) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self.configuration = configuration
        self.timeout = timeout

    @classmethod
    def from_policy(cls, policy: ScalingPolicy) -> KubernetesScaler:
        return cls(
            namespace=policy.kubernetes_namespace,
            deployment=policy.kubernetes_deployment,
            configuration=kubernetes_configuration(),
            timeout=settings.DMX_KUBERNETES_TIMEOUT_SECONDS,
        )

    def __str__(self) -> str:
        return f"deployment {self.namespace}/{self.deployment}"

    def current_replicas(self) -> int:
        """Return the Deployment's desired replicas: pods still starting count, so a slow start
        is not answered by a second scale-out."""
        return self._read().spec.replicas or 0

    def scale_to(self, replicas: int) -> None:
        scale = self._read()
        if (scale.spec.replicas or 0) == replicas:
            return
        body = {
            "metadata": {"resourceVersion": scale.metadata.resource_version},
            "spec": {"replicas": replicas},
        }
        self._call(
            "patch",
            lambda api: api.patch_namespaced_deployment_scale(
                self.deployment,
                self.namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout,
            ),
        )

    def _read(self) -> client.V1Scale:
        return self._call(
            "read",
            lambda api: api.read_namespaced_deployment_scale(
                self.deployment, self.namespace, _request_timeout=self.timeout
            ),
        )

    def _call(self, verb: str, request: Callable[[client.AppsV1Api], Any]) -> Any:
        with client.ApiClient(self.configuration) as api_client:
            try:
                return request(client.AppsV1Api(api_client))
            except ApiException as exc:
                raise ScalingError(
                    f"Kubernetes refused to {verb} the scale of {self}: "
                    f"{exc.status} {exc.reason}: {_status_message(exc)}"
                ) from exc
            except HTTPError as exc:
                raise ScalingError(
                    f"Kubernetes API server at {self.configuration.host} did not answer: {exc}"
                ) from exc


def _status_message(exc: ApiException) -> str:
    """Return the message of the Status object the API server sent with an error, if any."""
    try:
        return str(json.loads(exc.body).get("message", ""))[:200]
    except (TypeError, ValueError, AttributeError):
        return ""
