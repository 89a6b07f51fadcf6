"""The worker's side of the node protocol: JSON over HTTP with the node token, stdlib only."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from inference.wire import (
    ENGINE_SETTINGS_PATH,
    HEARTBEAT_PATH,
    REGISTER_PATH,
    TOKENIZER_PATH,
    EngineSettings,
    Heartbeat,
    HeartbeatAccepted,
    Registration,
    RegistrationAccepted,
    TokenizerUpload,
    WireError,
)

# The platform answers these calls from memory and one small write; 10 s means it is in trouble.
REQUEST_TIMEOUT = 10.0


class PlatformError(Exception):
    """The platform refused or could not be reached; `status` is None when unreachable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PlatformClient:
    """One keep-alive connection to the platform, reopened when the platform has closed it.

    A heartbeat every few seconds over a fresh connection each cost the gateway process that
    serves it an accept, a handshake and a close; on a kept connection it is one request.
    """

    def __init__(self, base_url: str, token: str) -> None:
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        self._https = url.scheme == "https"
        self._host = url.netloc
        self._prefix = url.path
        self._token = token
        self._connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _send(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, timeout=REQUEST_TIMEOUT)
        self._connection.request(
            method,
            self._prefix + path,
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        response = self._connection.getresponse()
        data = response.read()
        if response.will_close:
            self.close()
        return response.status, data

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        body = json.dumps(payload).encode() if payload is not None else None
        try:
            try:
                status, data = self._send(method, path, body)
            except ConnectionError:
                # The platform closed the kept connection (an idle timeout, a restart) before
                # this request reached it; every call here is idempotent, so send it again.
                self.close()
                status, data = self._send(method, path, body)
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            raise PlatformError(f"{method} {path}: {exc}") from exc
        if status >= 400:
            detail = data.decode(errors="replace")[:500]
            raise PlatformError(f"{method} {path}: {status} {detail}", status)
        return json.loads(data or b"{}")

    def register(self, registration: Registration) -> RegistrationAccepted:
        return RegistrationAccepted.from_dict(
            self._call("POST", REGISTER_PATH, registration.to_dict())
        )

    def heartbeat(self, node_id: int, heartbeat: Heartbeat) -> HeartbeatAccepted:
        """Send a heartbeat; the answer carries the operator's drain."""
        path = HEARTBEAT_PATH.format(node_id=node_id)
        answer = self._call("POST", path, heartbeat.to_dict())
        try:
            return HeartbeatAccepted.from_dict(answer)
        except WireError as exc:
            raise PlatformError(f"POST {path}: unexpected answer: {exc}") from exc

    def upload_tokenizer(self, sha256: str, upload: TokenizerUpload) -> None:
        self._call("PUT", TOKENIZER_PATH.format(sha256=sha256), upload.to_dict())

    def engine_settings(self, model: str, version: str) -> EngineSettings:
        """What the registry says this version's engine starts with; a PlatformError with
        status 404 when the version is not registered."""
        path = ENGINE_SETTINGS_PATH.format(
            model=urllib.parse.quote(model, safe=""), version=urllib.parse.quote(version, safe="")
        )
        answer = self._call("GET", path, None)
        try:
            return EngineSettings.from_dict(answer)
        except WireError as exc:
            raise PlatformError(f"GET {path}: unexpected answer: {exc}") from exc
