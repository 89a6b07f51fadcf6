"""deploy/kubernetes: every overlay renders, validates, and agrees with the code it deploys."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import promql_parser
import pytest
import yaml

from apps.routing.scaling.kubernetes import KubernetesScaler, kubernetes_configuration
from inference.engine import STOP_GRACE
from tests.deploy.manifests import KUBERNETES, OVERLAYS, prometheus_rule, prometheus_rule_groups
from tests.routing.scaling.kubernetes_standin import KubernetesApiStandIn

# The newest release kubernetes-validate carries schemas for (requirements/lock.txt pins it).
KUBERNETES_VERSION = "1.37.0"
CUSTOM_GROUPS = ("monitoring.coreos.com/",)
# inference/worker.py's default, when a pod does not set DMX_DRAIN_TIMEOUT.
DEFAULT_DRAIN_TIMEOUT = 30.0
# Request paths of the Kubernetes API: /apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME[/SUB].
API_PATH = re.compile(
    r"^/apis/(?P<group>[^/]+)/[^/]+/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)/(?P<name>[^/]+)"
    r"(?:/(?P<sub>[^/]+))?$"
)
# $(NAME) in an env value: the kubelet substitutes variables defined before it.
ENV_REFERENCE = re.compile(r"\$\((\w+)\)")
VERBS = {"GET": "get", "PATCH": "patch", "PUT": "update", "DELETE": "delete", "POST": "create"}

overlays = pytest.mark.parametrize("overlay", OVERLAYS)


def only(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind and name in (None, m["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def of_component(manifests: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    return [
        m
        for m in manifests
        if m["kind"] == "Deployment"
        and m["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only_container,) = pod(deployment)["containers"]
    return only_container


def env_value(manifests: list[dict[str, Any]], entry: dict[str, Any]) -> str:
    """Return an env entry's value, following a configMapKeyRef to the rendered ConfigMap."""
    if "value" in entry:
        return entry["value"]
    ref = entry["valueFrom"]["configMapKeyRef"]
    return only(manifests, "ConfigMap", ref["name"])["data"][ref["key"]]


def pod_env(manifests: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """The environment a pod's container gets from ConfigMaps and literals, $(VAR) expanded as
    the kubelet does; a fieldRef stands as `<fieldPath>`."""
    values: dict[str, str] = {}
    for source in container(deployment).get("envFrom", []):
        if "configMapRef" in source:
            values.update(only(manifests, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container(deployment).get("env", []):
        source = entry.get("valueFrom", {})
        if "fieldRef" in source:
            values[entry["name"]] = f"<{source['fieldRef']['fieldPath']}>"
        elif "value" in entry or "configMapKeyRef" in source:
            value = env_value(manifests, entry)
            values[entry["name"]] = ENV_REFERENCE.sub(lambda m: values.get(m[1], m[0]), value)
    return values


def pre_stop_seconds(deployment: dict[str, Any]) -> int:
    return container(deployment)["lifecycle"]["preStop"]["sleep"]["seconds"]


@overlays
def test_every_manifest_validates_against_the_kubernetes_schemas(rendered, overlay):
    for manifest in rendered[overlay]:
        if manifest["apiVersion"].startswith(CUSTOM_GROUPS):
            continue  # CRDs: test_monitoring_resources checks their structure
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@overlays
def test_everything_lives_in_the_overlays_namespace(rendered, overlay):
    namespace = only(rendered[overlay], "Namespace")["metadata"]["name"]
    for manifest in rendered[overlay]:
        if manifest["kind"] != "Namespace":
            assert manifest["metadata"]["namespace"] == namespace, manifest["metadata"]["name"]


@overlays
def test_the_scaler_role_allows_exactly_the_worker_deployments_scale(rendered, overlay):
    manifests = rendered[overlay]
    role = only(manifests, "Role", "dmx-scaler")
    workers = sorted(d["metadata"]["name"] for d in of_component(manifests, "inference-worker"))
    assert workers
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": workers,
            "verbs": ["get", "patch"],
        }
    ]
    binding = only(manifests, "RoleBinding", "dmx-scaler")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "dmx-scaler",
    }
    namespace = role["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dmx-scaler", "namespace": namespace}
    ]
    # The two processes that run the scaler: Alertmanager's webhook and the SLO evaluation.
    for name in ("dmx-gateway", "dmx-celery-worker"):
        assert pod(only(manifests, "Deployment", name))["serviceAccountName"] == "dmx-scaler"
    others = [m for m in manifests if m["kind"] in ("Deployment", "Job")]
    for manifest in others:
        if manifest["metadata"]["name"] not in ("dmx-gateway", "dmx-celery-worker"):
            assert pod_of(manifest).get("automountServiceAccountToken") is False


def pod_of(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]


@overlays
def test_every_request_the_scaler_makes_is_one_the_role_allows(rendered, overlay, settings):
    """The scaler, aimed at each worker Deployment the overlay creates, against the stand-in
    API server; each request it sends is then authorized by the overlay's Role, as RBAC would."""
    manifests = rendered[overlay]
    role = only(manifests, "Role", "dmx-scaler")
    with KubernetesApiStandIn() as kube:
        settings.DMX_KUBECONFIG = None
        settings.DMX_KUBERNETES_HOST = kube.url
        for deployment in of_component(manifests, "inference-worker"):
            namespace = deployment["metadata"]["namespace"]
            name = deployment["metadata"]["name"]
            kube.add(namespace, name, replicas=deployment["spec"]["replicas"])
            scaler = KubernetesScaler(
                namespace=namespace,
                deployment=name,
                configuration=kubernetes_configuration(),
                timeout=5,
            )
            scaler.scale_to(scaler.current_replicas() + 1)
            assert kube.replicas(namespace, name) == deployment["spec"]["replicas"] + 1
        assert kube.requests
        for request in kube.requests:
            assert allowed(role, request.method, request.path), (request.method, request.path)


def allowed(role: dict[str, Any], method: str, path: str) -> bool:
    match = API_PATH.match(path)
    if not match or match["ns"] != role["metadata"]["namespace"]:
        return False
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    return any(
        match["group"] in rule["apiGroups"]
        and resource in rule["resources"]
        and VERBS[method] in rule["verbs"]
        and match["name"] in rule.get("resourceNames", [match["name"]])
        for rule in role["rules"]
    )


@overlays
def test_a_worker_pod_outlives_its_drain_and_the_longest_stream(rendered, overlay):
    manifests = rendered[overlay]
    gateway = pod_env(manifests, only(manifests, "Deployment", "dmx-gateway"))
    longest_stream = float(gateway["DMX_REQUEST_TIMEOUT_SECONDS"])
    for deployment in of_component(manifests, "inference-worker"):
        env = pod_env(manifests, deployment)
        drain = float(env.get("DMX_DRAIN_TIMEOUT", DEFAULT_DRAIN_TIMEOUT))
        assert drain >= longest_stream
        needed = pre_stop_seconds(deployment) + drain + STOP_GRACE
        assert pod(deployment)["terminationGracePeriodSeconds"] > needed


@overlays
def test_a_gateway_pod_outlives_its_graceful_shutdown(rendered, overlay):
    manifests = rendered[overlay]
    deployment = only(manifests, "Deployment", "dmx-gateway")
    env = pod_env(manifests, deployment)
    # dmxplatform/serve.py's timeout_graceful_shutdown.
    shutdown = float(env["DMX_REQUEST_TIMEOUT_SECONDS"]) + float(
        env["DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS"]
    )
    assert (
        pod(deployment)["terminationGracePeriodSeconds"] > pre_stop_seconds(deployment) + shutdown
    )


@overlays
def test_the_gateway_is_probed_kept_available_and_scaled_on_cpu(rendered, overlay):
    manifests = rendered[overlay]
    deployment = only(manifests, "Deployment", "dmx-gateway")
    gateway = container(deployment)
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {"cpu", "memory"} <= set(gateway["resources"]["requests"])
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert only(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    assert only(manifests, "Service", "dmx-gateway")["spec"]["selector"] == labels
    hpa = only(manifests, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "dmx-gateway",
    }
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    assert hpa["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["maxReplicas"]


@overlays
def test_gateways_accept_the_hosts_they_are_reached_by(rendered, overlay):
    """Workers call DMX_PLATFORM_URL; Prometheus scrapes each pod at its IP."""
    manifests = rendered[overlay]
    allowed_hosts = pod_env(manifests, only(manifests, "Deployment", "dmx-gateway"))[
        "DJANGO_ALLOWED_HOSTS"
    ].split(",")
    assert "<status.podIP>" in allowed_hosts
    for deployment in of_component(manifests, "inference-worker"):
        platform = urlsplit(pod_env(manifests, deployment)["DMX_PLATFORM_URL"])
        assert platform.hostname in allowed_hosts
        service = only(manifests, "Service", platform.hostname.split(".")[0])
        assert platform.port in [p["port"] for p in service["spec"]["ports"]]


@overlays
def test_celery_beat_is_exactly_one_and_never_two_in_a_rollout(rendered, overlay):
    manifests = rendered[overlay]
    (beat,) = of_component(manifests, "celery-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert "beat" in container(beat)["args"]
    targets = [
        h["spec"]["scaleTargetRef"]["name"]
        for h in manifests
        if h["kind"] == "HorizontalPodAutoscaler"
    ]
    assert beat["metadata"]["name"] not in targets
    (worker,) = of_component(manifests, "celery-worker")
    assert "--beat" not in container(worker)["args"]


@overlays
def test_celery_pods_name_the_platforms_celery_app(rendered, overlay):
    """`celery -A X` names a module holding the platform's Celery app, with its beat schedule
    (the app once moved from dmxplatform to config and the manifests kept the old name)."""
    from celery.app.utils import find_app

    from config.celery import app as platform_app

    for component in ("celery-worker", "celery-beat"):
        (deployment,) = of_component(rendered[overlay], component)
        args = container(deployment)["args"]
        # As the celery command resolves -A.
        assert find_app(args[args.index("-A") + 1]) is platform_app, (component, args)


@overlays
def test_a_worker_deployment_gets_a_gpu_of_its_product_shm_and_the_model_cache(rendered, overlay):
    manifests = rendered[overlay]
    for deployment in of_component(manifests, "inference-worker"):
        spec, worker = pod(deployment), container(deployment)
        assert (
            worker["resources"]["requests"]["nvidia.com/gpu"]
            == worker["resources"]["limits"]["nvidia.com/gpu"]
            >= 1
        )
        (term,) = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert [e["key"] for e in term["matchExpressions"]] == ["nvidia.com/gpu.product"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        env = pod_env(manifests, deployment)
        assert env["HF_HOME"] in mounts
        labels = deployment["metadata"]["labels"]
        assert (
            deployment["metadata"]["name"]
            == f"dmx-worker-{slug(labels['dmx.io/model'])}-{labels['dmx.io/model-version']}"
        )
        assert env["DMX_WORKER_MODEL_NAME"] == labels["dmx.io/model"]
        assert env["DMX_WORKER_MODEL_VERSION"] == labels["dmx.io/model-version"]
        assert worker["readinessProbe"]["httpGet"]["port"] == "http"
        assert worker["ports"] == [{"name": "http", "containerPort": int(env["DMX_WORKER_PORT"])}]


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@overlays
def test_secrets_are_referenced_never_written_into_a_manifest(rendered, overlay):
    manifests = rendered[overlay]
    config = only(manifests, "ConfigMap", "dmx-config")["data"]
    for name in ("DJANGO_SECRET_KEY", "DMX_KEY_PEPPER", "DATABASE_URL", "DMX_NODE_TOKEN"):
        assert name not in config
    secret = only(manifests, "Secret", "dmx-secrets")
    assert {"DJANGO_SECRET_KEY", "DMX_KEY_PEPPER", "DATABASE_URL", "REDIS_URL"} <= set(
        secret["data"]
    )
    for deployment in of_component(manifests, "inference-worker"):
        assert all("secretRef" not in s for s in container(deployment).get("envFrom", []))


@overlays
def test_monitoring_resources(rendered, overlay):
    manifests = rendered[overlay]
    service = only(manifests, "Service", "dmx-gateway")
    secret_keys = set(only(manifests, "Secret", "dmx-secrets")["data"])

    monitor = only(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert credentials == {"name": "dmx-secrets", "key": "DMX_METRICS_TOKEN"}
    assert credentials["key"] in secret_keys

    rule = only(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == prometheus_rule_groups()
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for item in group["rules"]:
            assert ("record" in item) != ("alert" in item)
            assert set(item) <= {"record", "alert", "expr", "for", "labels", "annotations"}
            promql_parser.parse(item["expr"])

    alerting = only(manifests, "AlertmanagerConfig")
    assert alerting["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    route, (receiver,) = alerting["spec"]["route"], alerting["spec"]["receivers"]
    assert route["receiver"] == receiver["name"]
    (webhook,) = receiver["webhookConfigs"]
    port = service["spec"]["ports"][0]["port"]
    assert (
        webhook["url"]
        == f"http://{service['metadata']['name']}:{port}/internal/v1/alerts/alertmanager"
    )
    assert webhook["httpConfig"]["authorization"]["credentials"]["key"] == "DMX_ALERTMANAGER_TOKEN"
    assert "DMX_ALERTMANAGER_TOKEN" in secret_keys


def test_the_prometheus_rule_is_built_from_deploy_prometheus():
    path = Path(KUBERNETES, "base", "prometheusrule.yaml")
    assert yaml.safe_load(path.read_text()) == prometheus_rule(), (
        "run: python -m tests.deploy.manifests > deploy/kubernetes/base/prometheusrule.yaml"
    )


def test_the_webhook_path_is_the_platforms():
    from django.urls import resolve

    assert resolve("/internal/v1/alerts/alertmanager")
