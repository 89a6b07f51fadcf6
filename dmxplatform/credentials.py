"""Secrets with a visible id: `<prefix><id>_<secret>`, stored as HMAC-SHA256 under a pepper.

Used for API keys (`sk-dmx-`) and node tokens (`dmx-node-`). The id finds the row without a
scan; only HMAC(pepper, secret) is stored, so a database dump alone cannot forge a key, and the
comparison is constant-time. Neither the secret nor the whole credential is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

from django.conf import settings

ID_LENGTH = 8
# 32 url-safe characters from secrets.token_urlsafe(24): 192 bits, beyond brute force.
SECRET_BYTES = 24
ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True, slots=True)
class IssuedCredential:
    """A new credential: `plaintext` is shown once, the rest is stored."""

    credential_id: str
    secret_hash: str
    plaintext: str


def hash_secret(secret: str) -> str:
    """Return HMAC-SHA256 of the secret under the server pepper, hex."""
    pepper = settings.DMX_KEY_PEPPER.encode()
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


def issue(prefix: str, credential_id: str | None = None) -> IssuedCredential:
    """Generate a secret, and an id unless one is given (a rotation keeps its key's); return what
    to store and what to show."""
    credential_id = credential_id or "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return IssuedCredential(
        credential_id=credential_id,
        secret_hash=hash_secret(secret),
        plaintext=f"{prefix}{credential_id}_{secret}",
    )


def split(plaintext: str, prefix: str) -> tuple[str, str] | None:
    """Return (id, secret) from a presented credential, or None when it is malformed."""
    if not plaintext.startswith(prefix):
        return None
    credential_id, sep, secret = plaintext[len(prefix) :].partition("_")
    if not sep or len(credential_id) != ID_LENGTH or not secret:
        return None
    return credential_id, secret


def secret_matches(secret: str, secret_hash: str) -> bool:
    """Compare a presented secret with a stored hash in constant time."""
    return hmac.compare_digest(hash_secret(secret), secret_hash)


def bearer(authorization: bytes | None) -> str | None:
    """Return the credential of an `Authorization: Bearer <credential>` header, or None.

    The bytes are read as Latin-1, HTTP's own header encoding, so that no byte a client sends
    can fail to decode; a credential with such bytes simply matches nothing."""
    scheme, _, credential = (authorization or b"").decode("latin-1").partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None
