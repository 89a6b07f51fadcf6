"""What a request's dispatch does when no node takes it (wait for one that fits, or refuse),
and how its end is told to routing."""

import asyncio
import dataclasses

import pytest

from apps.routing.breaker import Breaker, breakers_key
from apps.routing.dispatcher import Dispatcher, NodeFailed
from apps.routing.errors import RoutingErrorCode
from dmxplatform.errors import (
    InvalidRequestError,
    ServiceUnavailableError,
    UpstreamError,
    UpstreamUnavailableError,
)
from dmxplatform.redis_client import sync_redis
from dmxplatform.stages import StageClock
from inference.wire import EngineLoad
from tests.keys.factories import run_with_redis
from tests.routing.factories import make_snapshot, route_request

# Their Redis keys are their own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("private_redis")


def dispatch_to(nodes, request, *, wake_after: float | None = None):
    """Dispatch `request` over `nodes`; with `wake_after`, the first node frees up then.
    Returns the name of the node that took it, or the error."""

    async def scenario(redis):
        dispatcher = Dispatcher(redis)
        dispatcher.fleet.replace({str(n.id).encode(): n.encode() for n in nodes})

        async def free_up():
            await asyncio.sleep(wake_after)
            freed = dataclasses.replace(nodes[0], engine=EngineLoad())
            dispatcher.fleet.replace({str(n.id).encode(): n.encode() for n in [freed, *nodes[1:]]})
            dispatcher.queues.wake(freed.model)

        if wake_after is not None:
            waker = asyncio.create_task(free_up())
        dispatch = dispatcher.dispatch(request, StageClock(), asked="m")

        async def send(node):
            return node.name

        try:
            async with dispatch.connect(send) as sent:
                return sent.answer
        except (InvalidRequestError, ServiceUnavailableError) as exc:
            return exc
        finally:
            if wake_after is not None:
                await waker

    return run_with_redis(scenario)


def test_a_request_no_node_has_the_context_for_is_refused_at_once_as_too_long(settings):
    settings.DMX_ADMISSION_TIMEOUT_SECONDS = 5
    short = [make_snapshot(name="a", max_model_len=150), make_snapshot(name="b", max_model_len=180)]
    error = dispatch_to(short, route_request(prompt_tokens=150, max_tokens=50))
    assert isinstance(error, InvalidRequestError)
    assert error.code == RoutingErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert error.param == "messages"
    assert "the longest holds 180 tokens" in error.message and "needs 200" in error.message


def test_a_request_waits_for_the_busy_node_that_fits_it(settings):
    settings.DMX_ADMISSION_TIMEOUT_SECONDS = 5
    busy = make_snapshot(name="busy", num_requests_waiting=50)
    short = make_snapshot(name="short", max_model_len=150)
    request = route_request(prompt_tokens=150, max_tokens=50)
    assert dispatch_to([busy, short], request, wake_after=0.3) == "busy"


def test_a_wait_for_a_node_that_fits_ends_in_no_capacity_when_none_frees_up(settings):
    settings.DMX_ADMISSION_TIMEOUT_SECONDS = 0.3
    busy = make_snapshot(name="busy", num_requests_waiting=50)
    short = make_snapshot(name="short", max_model_len=150)
    error = dispatch_to([busy, short], route_request(prompt_tokens=150, max_tokens=50))
    assert isinstance(error, ServiceUnavailableError)
    assert error.code == RoutingErrorCode.NO_CAPACITY
    assert "no node freed up in time" in error.message


def test_an_unstreamed_requests_prompt_stops_counting_as_queued_when_its_first_token_is_due():
    """The gateway never sees an unstreamed request's first token: its prompt would count as
    work ahead of every later request for its whole generation."""
    node = make_snapshot(name="node")

    async def scenario(redis):
        dispatcher = Dispatcher(redis)
        dispatcher.fleet.replace({str(node.id).encode(): node.encode()})
        seen = {}

        async def run(streamed: bool) -> None:
            request = route_request(prompt_tokens=1_000, streamed=streamed)
            dispatch = dispatcher.dispatch(request, StageClock(), asked="m")

            async def send(chosen):
                due = dispatch.predicted_ttft_ms / 1000
                seen[streamed, "at first"] = dispatcher.fleet.work[chosen.id].prefill_tokens
                await asyncio.sleep(due + 0.1)
                seen[streamed, "when due"] = dispatcher.fleet.work[chosen.id].prefill_tokens
                return chosen.name

            async with dispatch.connect(send):
                pass

        await run(streamed=False)
        await run(streamed=True)
        return seen, dispatcher.fleet.work[node.id].prefill_tokens

    seen, after = run_with_redis(scenario)
    # The fallback prefill rate predicts a first token in about half a second.
    assert seen[False, "at first"] == 1_000 and seen[False, "when due"] == 0
    # A stream's prompt waits for its first token, which the relay reports.
    assert seen[True, "at first"] == 1_000 and seen[True, "when due"] == 1_000
    assert after == 0


# -- How a dispatch ends: reported to routing once, on the block's exit -------------------------


def _failures(node) -> int:
    raw = sync_redis().hget(breakers_key(), str(node.id))
    return Breaker.parse(raw).failures if raw else 0


def end_dispatch(nodes, *, send_fails: set[str] = frozenset(), body=None):
    """Dispatch over `nodes` (`send` fails on those named in `send_fails`), run `body(sent)` in
    the block; return the node that took it (or the error) and the dispatcher's stats."""

    async def scenario(redis):
        dispatcher = Dispatcher(redis)
        dispatcher.fleet.replace({str(n.id).encode(): n.encode() for n in nodes})
        dispatch = dispatcher.dispatch(route_request(streamed=True), StageClock(), asked="m")

        async def send(node):
            if node.name in send_fails:
                raise NodeFailed(UpstreamError(f"{node.name} refused"))
            return node.name

        try:
            async with dispatch.connect(send) as sent:
                if body is not None:
                    await body(dispatch)
                return sent.answer, dispatcher.stats
        except Exception as exc:  # what the block's exit let through
            return exc, dispatcher.stats

    return run_with_redis(scenario)


def test_every_node_failing_before_it_answered_is_a_503_to_retry_and_counts_on_each():
    nodes = [make_snapshot(name="a"), make_snapshot(name="b")]
    error, _ = end_dispatch(nodes, send_fails={"a", "b"})
    assert isinstance(error, UpstreamUnavailableError)
    assert (error.status, error.code) == (503, "upstream_unavailable")
    assert int(error.headers["Retry-After"]) >= 1
    assert "refused" in error.message
    assert [_failures(n) for n in nodes] == [1, 1]


def test_a_node_failing_after_it_answered_counts_once_and_is_not_retried():
    nodes = [make_snapshot(name="a"), make_snapshot(name="b")]

    async def dies_mid_answer(dispatch):
        dispatch.first_token()
        raise NodeFailed(UpstreamError("cut"))

    error, stats = end_dispatch(nodes, body=dies_mid_answer)
    assert isinstance(error, NodeFailed)
    assert sorted(_failures(n) for n in nodes) == [0, 1]
    failed = next(n for n in nodes if _failures(n))
    assert stats.figures(failed.id).error_rate == 1.0


def test_a_normal_end_feeds_the_latency_window_and_the_requests_own_error_says_nothing():
    nodes = [make_snapshot(name="a")]

    async def answers(dispatch):
        dispatch.first_token()

    served, stats = end_dispatch(nodes, body=answers)
    assert served == "a"
    figures = stats.figures(nodes[0].id)
    assert (figures.samples, figures.error_rate) == (1, 0.0)
    assert _failures(nodes[0]) == 0

    async def refused(dispatch):
        raise InvalidRequestError("the engine refused the request")

    error, stats = end_dispatch(nodes, body=refused)
    assert isinstance(error, InvalidRequestError)
    assert stats.figures(nodes[0].id) is None and _failures(nodes[0]) == 0
