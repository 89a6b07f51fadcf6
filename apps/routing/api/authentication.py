"""DRF authentication for Alertmanager's webhook: `Authorization: Bearer <token>`."""

from __future__ import annotations

import hmac

from django.conf import settings
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from apps.routing.scaling.errors import ScalingErrorCode
from dmxplatform.credentials import bearer
from dmxplatform.errors import AuthenticationError, ServiceUnavailableError

REALM = 'Bearer realm="dmx-alertmanager"'


class AlertmanagerTokenAuthentication(BaseAuthentication):
    """Accept only the configured token; with none configured the webhook is off."""

    def authenticate(self, request: Request) -> tuple[None, str]:
        expected = settings.DMX_ALERTMANAGER_TOKEN
        if not expected:
            raise ServiceUnavailableError(
                "The Alertmanager webhook is off: DMX_ALERTMANAGER_TOKEN is not set.",
                code=ScalingErrorCode.ALERTMANAGER_NOT_CONFIGURED,
            )
        credential = bearer(get_authorization_header(request)) or ""
        # Constant time: the comparison must not tell how much of a guess was right.
        if not hmac.compare_digest(credential.encode("latin-1"), expected.encode()):
            raise AuthenticationError(
                "A valid Alertmanager token is required: Authorization: Bearer <token>.",
                code=ScalingErrorCode.INVALID_ALERTMANAGER_TOKEN,
                headers={"WWW-Authenticate": REALM},
            )
        return None, expected

    def authenticate_header(self, request: Request) -> str:
        return REALM
