"""The settle stage: the request's usage record, for its key's lease (KeyGate.lease) to settle
with, once: the refund of what the request did not use, its concurrency slot and the record go
to Redis in one call, before the answer's last bytes (Lease.submit) or, when something else
ended the request, as the lease's block ends.
"""

from __future__ import annotations

import time
from typing import Any

from apps.billing import metrics as billing_metrics
from apps.gateway.charges import served_rates
from apps.gateway.choices import ResponseStatus
from apps.gateway.dialects.base import Answer
from apps.gateway.dialects.responses import ResponseEvents, snapshot
from apps.gateway.outputs import identity
from apps.gateway.response_records import RESPONSES_STREAM, ResponseRecord, input_items
from apps.gateway.state import CompletionState, reached
from apps.keys.gate import MODEL_CHARS, Entry, PriorityTier, UsageEvent, UsageStatus
from dmxplatform import metrics
from dmxplatform.records import storable_text
from dmxplatform.stages import Stage

_TIER_LABELS = {tier.value: tier.name.lower() for tier in PriorityTier}
_TOKENS = metrics.Bound(metrics.gateway_tokens)
_SPEND = metrics.Bound(billing_metrics.spend)


def usage_record(
    state: CompletionState, ended_by: BaseException | None
) -> tuple[UsageEvent, tuple[Entry, ...]]:
    """The request's usage record and (when decisions are logged) its routing decision's,
    `ended_by` deciding how it ended (CompletionState.end)."""
    state.end(ended_by)
    timings = state.clock.timings
    if Stage.DECODE in timings or Stage.GENERATE in timings:
        state.clock.mark(Stage.SETTLE)
    usage = (state.editor.usage if state.editor else None) or state.usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    # vLLM's own count of the prompt tokens its prefix cache served (--enable-prompt-tokens-details)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    event = usage_event(state, prompt, completion)
    event.cached_tokens = cached
    if prompt or completion:
        key = reached(state.key, "auth")
        tier = _TIER_LABELS.get(key.priority, "standard")
        _TOKENS(event.model, "prompt", tier).inc(prompt)
        _TOKENS(event.model, "completion", tier).inc(completion)
        event.cost_micros = _cost(state, prompt, cached, completion)
        if event.cost_micros:
            _SPEND(event.model, key.plan).inc(event.cost_micros / 1_000_000)
    entries: tuple[Entry, ...] = ()
    if state.detached and state.kept is None:
        keep_response(state, _unfinished_record(state))
    if state.kept_payload is not None:
        entries += ((RESPONSES_STREAM.of_tenant(event.tenant_id).key(), state.kept_payload),)
    if state.dispatch is None:
        return event, entries
    decision = state.dispatch.decision_entry(
        request_id=state.request_id,
        tenant_id=event.tenant_id,
        created_at=state.received_at,
        intent=state.intent,
        intent_confidence=state.intent_confidence,
        intent_low_confidence=state.intent_low_confidence,
    )
    return event, (*entries, decision) if decision else entries


def keep_response(state: CompletionState, record: ResponseRecord) -> None:
    """The response to store as the request ends: its record goes in the settle call."""
    state.kept, state.kept_payload = record, record.encode()


def response_record(state: CompletionState, response: dict[str, Any]) -> ResponseRecord:
    """The stored record of the request's response object (apps.gateway.stored)."""
    key = reached(state.key, "auth")
    request = reached(state.request, "parse")
    return ResponseRecord(
        tenant_id=key.tenant_id,
        api_key_id=key.id,
        created_at=state.received_at,
        response=response,
        input_items=input_items(request.response_input, state.request_id),
    )


def _unfinished_record(state: CompletionState) -> ResponseRecord:
    """A background run that ended without its answer: cancelled (its client, the cancel
    flag, left) or failed, with what it wrote."""
    if state.outcome is UsageStatus.CLIENT_DISCONNECTED:
        status, error = ResponseStatus.CANCELLED, None
    else:
        status = ResponseStatus.FAILED
        message = state.error.message if state.error else "The run was interrupted."
        error = {"code": "server_error", "message": message}
    writer = state.writer
    if isinstance(writer, ResponseEvents):
        return response_record(state, writer.unfinished(status.value, error))
    return response_record(state, snapshot(background_answer(state), status.value, error))


def background_answer(state: CompletionState) -> Answer:
    """What the Responses dialect needs to shape a background run's object before a node
    answers it (the model as the client named it; no fingerprint yet)."""
    request = reached(state.request, "parse")
    return Answer(state.request_id, request, identity(model=request.model, version_tag=""))


def _cost(state: CompletionState, prompt: int, cached: int, completion: int) -> int:
    """What the tokens cost at the prices in force when the request arrived: the serving
    version's (the reservation's, the highest, should the version have none)."""
    rates, node = state.rates, state.node
    if rates is None:  # tokens without an admission cannot happen; nothing to price them at
        return 0
    if node is not None and state.prices is not None and state.model is not None:
        rates = (
            served_rates(state.prices, state.model, node.version_tag, state.received_at) or rates
        )
    multiplier = reached(state.key, "auth").price_multiplier
    return rates.cost(prompt, cached, completion, multiplier, batch=bool(state.batch_id))


def usage_event(state: CompletionState, prompt: int, completion: int) -> UsageEvent:
    node, started = state.node, state.started
    if state.dispatch is not None:
        model = state.dispatch.request.model.name
    else:  # as the client asked: anything a JSON string holds
        model = storable_text(state.request.model, MODEL_CHARS) if state.request else ""
    editor_flags = state.editor.flags() if state.editor else ()
    key = reached(state.key, "auth")
    return UsageEvent(
        request_id=state.request_id,
        api_key_id=key.id,
        tenant_id=key.tenant_id,
        created_at=state.received_at,
        endpoint=state.endpoint.value,
        model=model,
        model_version=node.version_tag if node else "",
        node=node.name if node else "",
        intent=state.intent,
        intent_confidence=state.intent_confidence,
        intent_low_confidence=state.intent_low_confidence,
        stream=bool(state.request and state.request.stream),
        status=state.outcome.value,
        http_status=state.http_status,
        error_code=state.error_code,
        prompt_tokens=prompt,
        completion_tokens=completion,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        time_to_first_token_ms=(
            round((state.first_token_at - started) * 1000, 3) if state.first_token_at else None
        ),
        estimated_prompt_tokens=state.estimated_tokens,
        context_limit=state.context_limit,
        content_flags=sorted({*state.flags, *editor_flags}),
        timings=state.clock.timings,
        client_request_id=state.client_request_id,
        trace_id=state.trace.trace_id,
        prepaid=key.prepaid,
        batch_id=state.batch_id,
    )
