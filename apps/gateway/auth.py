"""Authenticate `Authorization: Bearer sk-dmx-…` against the key cache."""

from __future__ import annotations

import time

from apps.gateway.errors import GatewayErrorCode
from apps.keys.keycache import KeyCache, KeyRecord
from apps.keys.models import KEY_PREFIX
from dmxplatform import credentials
from dmxplatform.errors import AuthenticationError


def _refuse(message: str, code: GatewayErrorCode) -> AuthenticationError:
    return AuthenticationError(message, code=code, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(keys: KeyCache, authorization: bytes | None) -> KeyRecord:
    """Return the key record for a bearer token, or raise a 401 that never echoes the secret."""
    if not authorization:
        raise _refuse(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            GatewayErrorCode.INVALID_API_KEY,
        )
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    parts = credentials.split(token.strip(), KEY_PREFIX) if scheme.lower() == "bearer" else None
    record = await keys.get(parts[0]) if parts else None
    if record is None or not credentials.secret_matches(parts[1], record.secret_hash):
        raise _refuse("Incorrect API key provided.", GatewayErrorCode.INVALID_API_KEY)
    if record.revoked:
        raise _refuse("This API key has been revoked.", GatewayErrorCode.KEY_REVOKED)
    if record.expired(time.time()):
        raise _refuse("This API key has expired.", GatewayErrorCode.KEY_EXPIRED)
    return record
