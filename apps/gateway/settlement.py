"""The settle stage: the request's usage record and the refund of what it did not use, once.

The settle call with the usage record is in the kernel's socket to Redis before the response's
last bytes leave (KeyGate.settle), so a response a client received always has its record even
if this process dies; Redis's answer is awaited after the response (confirm).
"""

from __future__ import annotations

import time

from apps.gateway.runtime import GatewayRuntime
from apps.gateway.state import CompletionState
from apps.keys.gate import MODEL_CHARS, PriorityTier, UsageEvent
from dmxplatform import metrics
from dmxplatform.records import storable_text
from dmxplatform.stages import Stage

_TIER_LABELS = {tier.value: tier.name.lower() for tier in PriorityTier}
_TOKENS = metrics.Bound(metrics.gateway_tokens)


async def settle(state: CompletionState, runtime: GatewayRuntime | None) -> None:
    """Settle and wait for Redis's answer (where nothing is left to send the client)."""
    await submit(state, runtime)
    await confirm(state)


async def submit(state: CompletionState, runtime: GatewayRuntime | None) -> None:
    """Refund the reservation's excess and append the usage record (and the routing decision,
    when it is logged); once per request, returning when the call is on its way."""
    if state.settlement is not None or state.key is None or runtime is None:
        return
    timings = state.clock.timings
    if Stage.DECODE in timings or Stage.GENERATE in timings:
        state.clock.mark(Stage.SETTLE)
    usage = (state.editor.usage if state.editor else None) or state.usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    event = usage_event(state, prompt, completion)
    decision = (
        state.dispatch.decision_entry(
            request_id=state.request_id,
            tenant_id=state.key.tenant_id,
            created_at=state.received_at,
            intent=state.intent,
            intent_confidence=state.intent_confidence,
            intent_low_confidence=state.intent_low_confidence,
        )
        if state.dispatch
        else None
    )
    state.settlement = runtime.gate.settle(
        state.admission,
        refund=state.reserved - prompt - completion,
        usage=event,
        entries=(decision,) if decision else (),
    )
    await state.settlement.sent()
    if prompt or completion:
        tier = _TIER_LABELS.get(state.key.priority, "standard")
        _TOKENS(event.model, "prompt", tier).inc(prompt)
        _TOKENS(event.model, "completion", tier).inc(completion)


async def confirm(state: CompletionState) -> None:
    """Wait for the settle call's answer, if one is on its way (spooled if Redis failed it)."""
    if state.settlement is not None:
        await state.settlement.confirm()


def usage_event(state: CompletionState, prompt: int, completion: int) -> UsageEvent:
    node, started = state.node, state.started
    if state.dispatch is not None:
        model = state.dispatch.request.model.name
    else:  # as the client asked: anything a JSON string holds
        model = storable_text(state.request.model, MODEL_CHARS) if state.request else ""
    editor_flags = state.editor.flags() if state.editor else ()
    return UsageEvent(
        request_id=state.request_id,
        api_key_id=state.key.id,
        tenant_id=state.key.tenant_id,
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
    )
