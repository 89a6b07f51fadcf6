"""A stand-in for the Kubernetes API server, serving only a Deployment's scale subresource.

NOT Kubernetes: no Kubernetes API server can run in the test environment, so this small HTTP
server answers the two calls KubernetesScaler makes, as kube-apiserver answers them:

    GET   /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale   -> autoscaling/v1 Scale
    PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale   merge, strategic-merge or
                                                                    JSON patch -> Scale

with resourceVersion preconditions (409 Conflict), 404 NotFound, 415 for other patch types,
422 Invalid for a negative count and, when given a token, 401 without it; errors are v1
Status objects. It records every request so tests can check what the client sent.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SCALE_PATH = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)/scale$"
)
MERGE_TYPES = {"application/merge-patch+json", "application/strategic-merge-patch+json"}
JSON_PATCH = "application/json-patch+json"


@dataclass
class Deployment:
    namespace: str
    name: str
    replicas: int
    resource_version: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = "2025-01-10T09:12:44Z"

    def scale(self) -> dict:
        """The Scale object, shaped as kube-apiserver returns it."""
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "resourceVersion": str(self.resource_version),
                "creationTimestamp": self.created,
            },
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.replicas, "selector": f"app={self.name}"},
        }


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names in lower case
    body: object


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A v1 Status, the body of every error kube-apiserver sends."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class KubernetesApiStandIn:
    """Holds deployments, serves their scale subresource on 127.0.0.1, records requests."""

    def __init__(self, *, token: str | None = None) -> None:
        self.token = token
        self.deployments: dict[tuple[str, str], Deployment] = {}
        self.requests: list[Recorded] = []
        # Another writer (an HPA, an operator's kubectl) that changes the object after each GET.
        self.interfere_after_read = False
        self._next_version = 40_000
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> KubernetesApiStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, namespace: str, name: str, replicas: int) -> Deployment:
        deployment = Deployment(namespace, name, replicas, self._version())
        self.deployments[namespace, name] = deployment
        return deployment

    def replicas(self, namespace: str, name: str) -> int:
        return self.deployments[namespace, name].replicas

    def patches(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "PATCH"]

    def _version(self) -> int:
        self._next_version += 1
        return self._next_version

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                standin.requests.append(
                    Recorded(
                        method,
                        parts.path,
                        parts.query,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
                with standin._lock:
                    code, answer = standin._answer(method, parts.path, self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def _answer(self, method: str, path: str, headers, body: object) -> tuple[int, dict]:
        if self.token and headers.get("Authorization") != f"Bearer {self.token}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        match = SCALE_PATH.match(path)
        if not match:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        deployment = self.deployments.get((match["ns"], match["name"]))
        if deployment is None:
            details = {"name": match["name"], "group": "apps", "kind": "deployments"}
            message = f'deployments.apps "{match["name"]}" not found'
            return 404, status(404, "NotFound", message, details)
        if method == "GET":
            scale = deployment.scale()
            if self.interfere_after_read:
                deployment.resource_version = self._version()
            return 200, scale
        return self._patch(deployment, headers.get("Content-Type", ""), body)

    def _patch(self, deployment: Deployment, content_type: str, body: object) -> tuple[int, dict]:
        media = content_type.split(";")[0].strip()
        if media in MERGE_TYPES and isinstance(body, dict):
            wanted_version = (body.get("metadata") or {}).get("resourceVersion")
            replicas = (body.get("spec") or {}).get("replicas", deployment.replicas)
        elif media == JSON_PATCH and isinstance(body, list):
            wanted_version = None
            replicas = deployment.replicas
            for op in body:
                if op.get("op") in ("replace", "add") and op.get("path") == "/spec/replicas":
                    replicas = op.get("value")
        else:
            message = (
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml"
            )
            return 415, status(415, "UnsupportedMediaType", message)
        if wanted_version is not None and wanted_version != str(deployment.resource_version):
            message = (
                f'Operation cannot be fulfilled on deployments.apps "{deployment.name}": the '
                "object has been modified; please apply your changes to the latest version and "
                "try again"
            )
            details = {"name": deployment.name, "group": "apps", "kind": "deployments"}
            return 409, status(409, "Conflict", message, details)
        if not isinstance(replicas, int) or replicas < 0:
            message = (
                f'Scale.autoscaling "{deployment.name}" is invalid: spec.replicas: Invalid '
                f"value: {replicas}: must be greater than or equal to 0"
            )
            return 422, status(422, "Invalid", message)
        if replicas != deployment.replicas:
            deployment.replicas = replicas
            deployment.resource_version = self._version()
        return 200, deployment.scale()
