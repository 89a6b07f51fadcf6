"""The price list, as developers read it before calling a model."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from apps.billing.models import Price


@dataclass(frozen=True, slots=True)
class PriceLine:
    model: str
    version: str
    kind: str  # the model's kind: generate or embed
    price: Price  # in force now
    next: Price | None  # scheduled after it, if any


def prices_of_version(model_version_id: int) -> QuerySet[Price]:
    return Price.objects.filter(model_version_id=model_version_id).order_by("-effective_from")


def price_list(*, now: datetime | None = None) -> list[PriceLine]:
    """Every active model version's price in force (versions without one are not offered to
    tenants that pay), with the next price scheduled, by model and version."""
    moment = now or timezone.now()
    rows = (
        Price.objects.filter(model_version__is_active=True, model_version__model__is_active=True)
        .select_related("model_version__model")
        .order_by("model_version__model__name", "model_version__tag", "effective_from")
    )
    current: dict[int, Price] = {}
    upcoming: dict[int, Price] = {}
    for price in rows:
        version = price.model_version_id
        if price.effective_from <= moment:
            current[version] = price
        else:
            upcoming.setdefault(version, price)
    return [
        PriceLine(
            model=price.model_version.model.name,
            version=price.model_version.tag,
            kind=price.model_version.model.kind,
            price=price,
            next=upcoming.get(version),
        )
        for version, price in current.items()
    ]
