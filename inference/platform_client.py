"""The worker's side of the node protocol: JSON over HTTP with the node token, stdlib only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from inference.wire import (
    HEARTBEAT_PATH,
    REGISTER_PATH,
    TOKENIZER_PATH,
    Heartbeat,
    Registration,
    RegistrationAccepted,
    TokenizerUpload,
)

# The platform answers these calls from memory and one small write; 10 s means it is in trouble.
REQUEST_TIMEOUT = 10.0


class PlatformError(Exception):
    """The platform refused or could not be reached; `status` is None when unreachable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PlatformClient:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token

    def _call(self, method: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(payload).encode(),
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise PlatformError(f"{method} {path}: {exc.code} {detail}", exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise PlatformError(f"{method} {path}: {exc}") from exc

    def register(self, registration: Registration) -> RegistrationAccepted:
        return RegistrationAccepted.from_dict(
            self._call("POST", REGISTER_PATH, registration.to_dict())
        )

    def heartbeat(self, node_id: int, heartbeat: Heartbeat) -> None:
        self._call("POST", HEARTBEAT_PATH.format(node_id=node_id), heartbeat.to_dict())

    def upload_tokenizer(self, sha256: str, upload: TokenizerUpload) -> None:
        self._call("PUT", TOKENIZER_PATH.format(sha256=sha256), upload.to_dict())
