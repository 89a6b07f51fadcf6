from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.routing.scaling.kubernetes_standin import KubernetesApiStandIn


@pytest.fixture
def kube(settings) -> Iterator[KubernetesApiStandIn]:
    """The stand-in Kubernetes API server, which the Kubernetes scaler is pointed at."""
    with KubernetesApiStandIn() as standin:
        settings.DMX_KUBECONFIG = None
        settings.DMX_KUBERNETES_HOST = standin.url
        yield standin
