"""Optional HMAC-SHA256 request signing per key.

A client that signs sends `X-DMX-Timestamp: <unix seconds>` and
`X-DMX-Signature: hex(HMAC-SHA256(signing_secret, "<timestamp>." + body))`. The gateway refuses
timestamps more than WINDOW_SECONDS away from its clock, and a signature it has seen before
(remembered in Redis for REPLAY_TTL_SECONDS, in the same round trip as the rate limits).

The secret must be readable to verify an HMAC, so unlike the API key it cannot be stored as a
hash: it is encrypted at rest (Fernet, keyed from DMX_KEY_PEPPER) and decrypted only in the
gateway's memory.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from functools import cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from apps.keys.errors import KeysErrorCode
from dmxplatform.errors import AuthenticationError

WINDOW_SECONDS = 300
# Longer than the window, so a signature cannot come back once its entry expired.
REPLAY_TTL_SECONDS = 2 * WINDOW_SECONDS
SECRET_PREFIX = "dmxsig_"


@cache
def _fernet(pepper: str) -> Fernet:
    key = hashlib.sha256(b"dmx-request-signing\0" + pepper.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def signing_secret_issue() -> tuple[str, str]:
    """Return a new signing secret and its encrypted form for storage."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    return secret, _fernet(settings.DMX_KEY_PEPPER).encrypt(secret.encode()).decode()


def signing_secret_decrypt(encrypted: str) -> bytes | None:
    """Return the secret's bytes, or None when it cannot be decrypted (pepper changed)."""
    try:
        return _fernet(settings.DMX_KEY_PEPPER).decrypt(encrypted.encode())
    except InvalidToken:
        return None


def signature_for(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _refuse(message: str, code: KeysErrorCode) -> AuthenticationError:
    return AuthenticationError(message, code=code)


def signature_verify(
    *,
    secret: bytes | None,
    timestamp: bytes | None,
    signature: bytes | None,
    body: bytes,
    now: float | None = None,
) -> str:
    """Check a request's signature; return it (the replay nonce) or raise a 401."""
    if not timestamp or not signature:
        raise _refuse(
            "This key requires signed requests: send X-DMX-Timestamp and X-DMX-Signature.",
            KeysErrorCode.SIGNATURE_REQUIRED,
        )
    stamp = timestamp.decode("latin-1")
    try:
        age = abs((time.time() if now is None else now) - int(stamp))
    except ValueError:
        raise _refuse(
            "X-DMX-Timestamp must be Unix seconds.", KeysErrorCode.SIGNATURE_INVALID
        ) from None
    if age > WINDOW_SECONDS:
        raise _refuse(
            f"The request's timestamp is more than {WINDOW_SECONDS} s from the server's clock.",
            KeysErrorCode.SIGNATURE_EXPIRED,
        )
    presented = signature.decode("latin-1").strip().lower()
    if secret is None or not hmac.compare_digest(presented, signature_for(secret, stamp, body)):
        raise _refuse("The request signature does not match.", KeysErrorCode.SIGNATURE_INVALID)
    return presented
