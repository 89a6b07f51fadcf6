"""DRF authentication for inference workers: `Authorization: Bearer dmx-node-...`."""

from __future__ import annotations

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.hardware.nodestate import TokenRecord
from apps.hardware.services import node_token_authenticate
from dmxplatform.credentials import bearer


class NodeTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[None, TokenRecord] | None:
        credential = bearer(get_authorization_header(request))
        if credential is None:
            return None
        return None, node_token_authenticate(plaintext=credential)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="dmx-nodes"'
