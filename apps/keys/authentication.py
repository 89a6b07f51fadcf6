"""Who may call: the bearer key, its client networks and, for signing keys, the signature."""

from __future__ import annotations

import time
from typing import Any

from apps.keys.errors import KeysErrorCode
from apps.keys.keycache import KeyCache, KeyRecord
from apps.keys.models import KEY_PREFIX
from apps.keys.signing import signature_verify
from dmxplatform import credentials
from dmxplatform.errors import AuthenticationError, PermissionDeniedError
from dmxplatform.responses import header


def _refuse(message: str, code: KeysErrorCode) -> AuthenticationError:
    return AuthenticationError(message, code=code, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(keys: KeyCache, authorization: bytes | None) -> KeyRecord:
    """Return the key record for a bearer token, or raise a 401 that never echoes the secret."""
    if not authorization:
        raise _refuse(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            KeysErrorCode.INVALID_API_KEY,
        )
    token = credentials.bearer(authorization)
    parts = credentials.split(token, KEY_PREFIX) if token else None
    record = await keys.get(parts[0]) if parts else None
    now = time.time()
    if record is None or not any(
        credentials.secret_matches(parts[1], h) for h in record.secret_hashes(now)
    ):
        raise _refuse("Incorrect API key provided.", KeysErrorCode.INVALID_API_KEY)
    check_usable(record, now)
    return record


def check_usable(record: KeyRecord, now: float) -> None:
    """Refuse a revoked or expired key (also one the portal's playground acts for)."""
    if record.revoked:
        raise _refuse("This API key has been revoked.", KeysErrorCode.KEY_REVOKED)
    if record.expired(now):
        raise _refuse("This API key has expired.", KeysErrorCode.KEY_EXPIRED)


def check_network(key: KeyRecord, address: str | None) -> None:
    """Refuse a client outside the key's allowed networks (403, as OpenAI's IP allowlists do)."""
    if not key.allows_address(address):
        raise PermissionDeniedError(
            f"This API key may not be used from {address or 'an unknown address'}.",
            code=KeysErrorCode.NETWORK_NOT_ALLOWED,
        )


def check_signature(key: KeyRecord, scope: dict[str, Any], body: bytes) -> str | None:
    """Verify a signing key's request; return the signature to remember against replays."""
    if not key.signing_secret_encrypted:
        return None
    return signature_verify(
        secret=key.signing_secret,
        timestamp=header(scope, b"x-dmx-timestamp"),
        signature=header(scope, b"x-dmx-signature"),
        body=body,
    )
