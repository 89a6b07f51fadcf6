"""The pipeline's own end, inside one process (no servers): a request that ends without a
complete response while its client waits is logged with its id and counted."""

from __future__ import annotations

import asyncio
import logging

from apps.gateway import pipeline
from apps.gateway.schemas import Endpoint
from apps.gateway.state import CompletionState
from dmxplatform import metrics

UNANSWERED = metrics.gateway_connections_closed.labels("unanswered")


def test_a_request_cancelled_before_its_answer_is_logged_by_id_and_counted(monkeypatch, caplog):
    """The server stopping past its grace period cancels the request: uvicorn closes the
    connection, and only the pipeline knows which request that was."""

    async def runtime():
        return object()

    monkeypatch.setattr(pipeline, "get_runtime", runtime)
    sent: list[dict] = []

    async def scenario() -> CompletionState:
        reading = asyncio.Event()

        async def receive():
            reading.set()
            await asyncio.Event().wait()  # the body never comes

        async def send(message):
            sent.append(message)

        state = CompletionState(Endpoint.CHAT, {"headers": []}, receive, send)
        task = asyncio.ensure_future(pipeline.complete(state))
        await reading.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        return state

    before = UNANSWERED._value.get()
    with caplog.at_level(logging.ERROR, logger="apps.gateway.pipeline"):
        state = asyncio.run(scenario())
    assert sent == []
    assert UNANSWERED._value.get() == before + 1
    assert (
        f"request {state.request_id} closed without a complete response: cancelled" in caplog.text
    )


def test_an_answered_request_counts_as_no_unanswered_close(monkeypatch):
    """A refusal (here: a body over the limit) is an answer: nothing is logged or counted."""

    async def runtime():
        return object()

    monkeypatch.setattr(pipeline, "get_runtime", runtime)
    monkeypatch.setattr(pipeline, "MAX_BODY_BYTES", 4)
    sent: list[dict] = []

    async def scenario() -> None:
        async def receive():
            return {"type": "http.request", "body": b"0123456789", "more_body": False}

        async def send(message):
            sent.append(message)

        await pipeline.complete(CompletionState(Endpoint.CHAT, {"headers": []}, receive, send))

    before = UNANSWERED._value.get()
    asyncio.run(scenario())
    assert sent[0]["status"] == 413
    assert not sent[-1].get("more_body", False)
    assert UNANSWERED._value.get() == before
