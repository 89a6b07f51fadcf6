"""Prices: set ahead of time, never changed after (a new price is a new row)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.billing.models import Price
from apps.billing.pricing import PRICES_VERSION


def price_set(
    *,
    model_version_id: int,
    input_per_million: Decimal,
    output_per_million: Decimal,
    cached_input_per_million: Decimal | None = None,
    effective_from: datetime | None = None,
    actor: str = "",
) -> Price:
    """A model version's price from `effective_from` on (default: as soon as it may). A new
    price of a priced version takes effect DMX_PRICE_LEAD_SECONDS from now at the earliest, so
    that every gateway holds it first and no two price one moment differently; a version's first
    price may start now (until a gateway holds it, the version is refused, never mispriced).
    Cached input defaults to the input price; all zero marks the model free."""
    now = timezone.now()
    priced = Price.objects.filter(model_version_id=model_version_id).exists()
    earliest = now + timedelta(seconds=settings.DMX_PRICE_LEAD_SECONDS) if priced else now
    when = effective_from or earliest
    if when < earliest:
        raise ValidationError(
            {
                "effective_from": "A price takes effect no earlier than "
                f"{settings.DMX_PRICE_LEAD_SECONDS} s from now, so that every gateway holds it "
                "first; past costs never change."
            }
        )
    price = Price(
        model_version_id=model_version_id,
        input_per_million=input_per_million,
        cached_input_per_million=(
            input_per_million if cached_input_per_million is None else cached_input_per_million
        ),
        output_per_million=output_per_million,
        effective_from=when,
        created_by=actor,
    )
    if price.cached_input_per_million > price.input_per_million:
        raise ValidationError(
            {"cached_input_per_million": "Cached input cannot cost more than input."}
        )
    price.full_clean()
    price.save()
    PRICES_VERSION.bump_on_commit()
    return price


def price_withdraw(*, price: Price) -> None:
    """Take back a price that has not taken effect yet (one in force is history)."""
    if price.effective_from <= timezone.now() + timedelta(seconds=settings.DMX_PRICE_LEAD_SECONDS):
        raise ValidationError("A price in force (or about to be) cannot be withdrawn.")
    with transaction.atomic():
        price.delete()
        PRICES_VERSION.bump_on_commit()
