"""KubernetesScaler against the stand-in API server (kubernetes_standin.py, beside this)."""

import re
import socket

import pytest
import yaml

from apps.routing.scaling.errors import ScalingError
from apps.routing.scaling.kubernetes import MERGE_PATCH, KubernetesScaler, kubernetes_configuration
from tests.routing.scaling.kubernetes_standin import KubernetesApiStandIn

NS, NAME = "inference", "vllm-dmx-tiny"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}/scale"


def scaler(deployment: str = NAME) -> KubernetesScaler:
    return KubernetesScaler(
        namespace=NS, deployment=deployment, configuration=kubernetes_configuration(), timeout=5
    )


def test_current_replicas_reads_the_scale_subresource(kube):
    kube.add(NS, NAME, replicas=3)

    assert scaler().current_replicas() == 3
    assert [(r.method, r.path) for r in kube.requests] == [("GET", SCALE_PATH)]


def test_scale_to_patches_replicas_with_the_resource_version_it_read(kube):
    deployment = kube.add(NS, NAME, replicas=2)
    version_read = str(deployment.resource_version)

    scaler().scale_to(4)

    assert kube.replicas(NS, NAME) == 4
    (patch,) = kube.patches()
    assert patch.path == SCALE_PATH
    assert patch.headers["content-type"] == MERGE_PATCH
    assert patch.body == {"metadata": {"resourceVersion": version_read}, "spec": {"replicas": 4}}
    assert str(deployment.resource_version) != version_read  # the server saw a change
    assert scaler().current_replicas() == 4


def test_scale_to_the_current_count_sends_no_patch(kube):
    kube.add(NS, NAME, replicas=2)

    scaler().scale_to(2)

    assert kube.patches() == []


def test_a_concurrent_change_is_refused_not_overwritten(kube):
    kube.add(NS, NAME, replicas=2)
    kube.interfere_after_read = True  # someone else writes between our read and our patch

    with pytest.raises(ScalingError, match="409 Conflict"):
        scaler().scale_to(5)
    assert kube.replicas(NS, NAME) == 2


def test_a_missing_deployment_is_a_scaling_error(kube):
    with pytest.raises(ScalingError, match=re.escape('deployments.apps "absent" not found')):
        scaler("absent").current_replicas()


def test_kubeconfig_credentials_are_sent(settings, tmp_path):
    with KubernetesApiStandIn(token="sa-token-123") as standin:
        standin.add(NS, NAME, replicas=1)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": standin.url}}],
                    "users": [{"name": "dmx", "user": {"token": "sa-token-123"}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "dmx"}}],
                    "current-context": "test",
                }
            )
        )
        settings.DMX_KUBECONFIG = str(kubeconfig)
        settings.DMX_KUBERNETES_HOST = None

        scaler().scale_to(2)

        assert standin.replicas(NS, NAME) == 2
        assert {r.headers.get("authorization") for r in standin.requests} == {"Bearer sa-token-123"}

        settings.DMX_KUBECONFIG = None  # the host alone: no credentials
        settings.DMX_KUBERNETES_HOST = standin.url
        with pytest.raises(ScalingError, match="401 Unauthorized"):
            scaler().current_replicas()


def test_an_unreachable_api_server_is_a_scaling_error(settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    settings.DMX_KUBECONFIG = None
    settings.DMX_KUBERNETES_HOST = f"http://127.0.0.1:{port}"

    with pytest.raises(ScalingError, match="did not answer"):
        scaler().current_replicas()
