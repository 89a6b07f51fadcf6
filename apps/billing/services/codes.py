"""Redemption codes: generated in batches by an operator, shown once, stored as HMACs, each
crediting exactly one tenant exactly once.

A redemption is one conditional UPDATE ... RETURNING: of any number of concurrent redemptions
of one code, PostgreSQL lets exactly one update the row (the others wait on its row lock, then
find it redeemed and update nothing), and the credit is made in that same transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.billing.choices import MovementKind
from apps.billing.errors import BillingErrorCode
from apps.billing.models import BalanceMovement, RedemptionBatch, RedemptionCode
from apps.billing.money import MAX_AMOUNT
from apps.billing.services.balances import credit
from dmxplatform.audit.entries import audit_created

# Crockford's base32 without look-alikes; 20 characters: 100 bits, grouped by 4 to read out.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_LENGTH = 20
MAX_BATCH = 10_000
# What a form or the API takes as a code: DMX- and 20 characters in groups of 4, with room for
# the spaces people paste; anything longer is not one.
MAX_CODE_LENGTH = 64


class RedemptionError(Exception):
    def __init__(self, message: str, code: BillingErrorCode) -> None:
        super().__init__(message)
        self.code = code


def _normal(code: str) -> str:
    return code.upper().replace("-", "").replace(" ", "").removeprefix("DMX")


def code_hash(code: str) -> str:
    """The code's HMAC under the platform's pepper (DMX_KEY_PEPPER, which API key secrets are
    stored under too), kept apart from a key's by its own prefix."""
    message = b"redemption-code:" + _normal(code).encode()
    return hmac.new(settings.DMX_KEY_PEPPER.encode(), message, hashlib.sha256).hexdigest()


def codes_generate(
    *,
    face_value: Decimal,
    count: int,
    expires_at: datetime | None = None,
    note: str = "",
    actor: str = "",
) -> tuple[RedemptionBatch, list[str]]:
    """A batch of `count` codes worth `face_value` each; the codes are returned this once."""
    if not 1 <= count <= MAX_BATCH:
        raise ValueError(f"A batch holds 1 to {MAX_BATCH} codes.")
    if not 0 < face_value <= MAX_AMOUNT:
        raise ValueError(f"A code is worth more than zero and at most {MAX_AMOUNT}.")
    codes = [
        "DMX-"
        + "-".join(
            "".join(secrets.choice(_ALPHABET) for _ in range(4)) for _ in range(_LENGTH // 4)
        )
        for _ in range(count)
    ]
    with transaction.atomic():
        batch = RedemptionBatch.objects.create(
            face_value=face_value, count=count, expires_at=expires_at, note=note, created_by=actor
        )
        RedemptionCode.objects.bulk_create(
            RedemptionCode(batch=batch, code_hash=code_hash(code), hint=code[-4:]) for code in codes
        )
        audit_created([batch])
    return batch, codes


def redeem(*, tenant_id: int, code: str, actor: str = "") -> BalanceMovement:
    """Credit the code's face value to the tenant's balance, or raise RedemptionError."""
    digest = code_hash(code)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE {RedemptionCode._meta.db_table} AS code SET redeemed_by_id = %s,
                       redeemed_at = %s
                  FROM {RedemptionBatch._meta.db_table} AS batch
                 WHERE code.code_hash = %s AND code.batch_id = batch.id
                   AND code.redeemed_at IS NULL
                   AND (batch.expires_at IS NULL OR batch.expires_at > %s)
             RETURNING code.id, batch.face_value
                """,
                [tenant_id, timezone.now(), digest, timezone.now()],
            )
            row = cursor.fetchone()
        if row is None:
            raise _why_not(digest)
        code_id, face_value = row
        return credit(
            tenant_id=tenant_id,
            kind=MovementKind.REDEMPTION,
            amount=face_value,
            key=f"redeem:{code_id}",
            note=f"code …{code[-4:].upper()}",
            actor=actor,
        )


def _why_not(digest: str) -> RedemptionError:
    found = RedemptionCode.objects.select_related("batch").filter(code_hash=digest).first()
    if found is None:
        return RedemptionError("This code is not valid.", BillingErrorCode.CODE_INVALID)
    if found.redeemed_at is not None:
        return RedemptionError("This code was already redeemed.", BillingErrorCode.CODE_USED)
    return RedemptionError("This code has expired.", BillingErrorCode.CODE_EXPIRED)
