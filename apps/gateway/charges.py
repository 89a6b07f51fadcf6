"""What a request may cost, held at admission, and what it cost, settled with its usage.

Prices come from the gateway's copy of the price book, as it stood when the request arrived:
the reservation at each price's highest among the versions routing may pick (it has not picked
yet), the cost at the prices of the version that served. Both in integer micro-units
(apps.billing.money); the reservation is the worst case, so the cost never exceeds it.
"""

from __future__ import annotations

from apps.billing.errors import BillingErrorCode
from apps.billing.money import Rates
from apps.billing.pricing import PriceBook
from apps.gateway.context import PromptCount
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.models.catalog import ModelEntry
from dmxplatform.errors import PermissionDeniedError


def reservation_rates(book: PriceBook, model: ModelEntry, moment: float) -> Rates:
    """The prices to hold a request for `model` at, or the refusal of a model not priced."""
    rates = book.reservation_rates(list(model.versions), moment)
    if rates is None:
        raise PermissionDeniedError(
            f"The model `{model.name}` has no price yet, so its requests cannot be billed. "
            "Ask the platform's operators to price it.",
            param="model",
            code=BillingErrorCode.MODEL_NOT_PRICED,
        )
    return rates


def worst_case(
    request: CompletionRequest,
    count: PromptCount,
    context_limit: int,
    rates: Rates,
    multiplier: int,
    *,
    batch: bool = False,
) -> int:
    """The most the request may cost: every prompt at the input price and, for each choice of
    each, `max_tokens` (or, without it, the rest of the context) at the output price."""
    if request.endpoint is Endpoint.EMBEDDINGS:
        completion = 0
    else:
        per_choice = request.max_tokens
        if per_choice is None:
            per_choice = max(context_limit - (count.tokens or 0), 0)
        completion = per_choice * request.n * count.prompts
    return rates.worst_case(count.all_tokens or 0, completion, multiplier, batch=batch)


def served_rates(
    book: PriceBook, model: ModelEntry, version_tag: str, moment: float
) -> Rates | None:
    """The prices of the version that served, at `moment`."""
    for version in model.versions.values():
        if version.tag == version_tag:
            return book.rates(version.id, moment)
    return None
