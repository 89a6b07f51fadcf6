"""The node protocol's platform side: registration, tokenizer uploads and the engine settings
a worker starts vLLM with (inference/wire.py).

Heartbeats, which every node sends every few seconds, are served outside Django
(apps.hardware.consumers).
"""

from __future__ import annotations

from typing import TypeVar

from django.conf import settings
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.hardware.api.authentication import NodeTokenAuthentication
from apps.hardware.errors import HardwareErrorCode
from apps.hardware.services import node_register
from apps.models.selectors import model_version_engine_settings
from apps.models.services import tokenizer_store
from dmxplatform.errors import InvalidRequestError
from inference.wire import (
    Message,
    Registration,
    RegistrationAccepted,
    TokenizerUpload,
    WireError,
)

M = TypeVar("M", bound=Message)


class NodeApiView(APIView):
    """Authenticated by a node token; parses bodies with the wire module's strict types."""

    authentication_classes = [NodeTokenAuthentication]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if request.auth is None:
            raise NotAuthenticated("A node token is required: Authorization: Bearer dmx-node-…")

    @staticmethod
    def parse(message: type[M], request: Request) -> M:
        try:
            return message.from_dict(request.data)
        except WireError as exc:
            raise InvalidRequestError(
                exc.message, param=exc.field, code=HardwareErrorCode.INVALID_PAYLOAD
            ) from exc


class NodeRegisterView(NodeApiView):
    def post(self, request: Request) -> Response:
        registration = self.parse(Registration, request)
        node, tokenizer_wanted = node_register(token=request.auth, registration=registration)
        accepted = RegistrationAccepted(
            node_id=node.id,
            heartbeat_seconds=settings.DMX_HEARTBEAT_SECONDS,
            tokenizer_wanted=tokenizer_wanted,
        )
        return Response(accepted.to_dict(), status=201)


class TokenizerUploadView(NodeApiView):
    def put(self, request: Request, sha256: str) -> Response:
        upload = self.parse(TokenizerUpload, request)
        tokenizer = tokenizer_store(sha256=sha256, upload=upload)
        return Response({"sha256": tokenizer.sha256}, status=201)


class EngineSettingsView(NodeApiView):
    def get(self, request: Request, model: str, version: str) -> Response:
        settings = model_version_engine_settings(model_name=model, tag=version)
        return Response(settings.to_dict())
