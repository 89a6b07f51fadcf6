"""DRF authentication for inference workers: `Authorization: Bearer dmx-node-...`."""

from __future__ import annotations

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.hardware.fleet import TokenRecord
from apps.hardware.services import node_token_authenticate


class NodeTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[None, TokenRecord] | None:
        scheme, _, credential = get_authorization_header(request).decode().partition(" ")
        if scheme.lower() != "bearer" or not credential:
            return None
        return None, node_token_authenticate(plaintext=credential.strip())

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="dmx-nodes"'
