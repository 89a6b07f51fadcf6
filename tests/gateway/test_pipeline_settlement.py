"""The settle call and the large-request thread, inside one gateway process (no servers)."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from apps.gateway import settlement
from apps.gateway.runtime import GatewayRuntime
from apps.gateway.schemas import Endpoint
from apps.gateway.state import CompletionState
from apps.keys.gate import KeyGate, UsageStatus
from dmxplatform.errors import RateLimitError, ServiceUnavailableError
from dmxplatform.redis_client import request_resp_client, resp_client
from dmxplatform.spool import Spool, read_entries
from tests.keys.factories import make_key_record


class SlowLimiter:
    """submit_settle that takes its time (a reconnect, SCRIPT LOAD), then succeeds or fails."""

    def __init__(self, *, fails: bool) -> None:
        self.fails = fails
        self.calls = 0
        self.release = asyncio.Event()

    async def submit_settle(self, admission, *, refund, events, money=0, once=None):
        self.calls += 1
        await self.release.wait()
        if self.fails:
            raise ConnectionError("Redis went away")
        reply = asyncio.get_running_loop().create_future()
        reply.set_result(b"OK")
        return reply


class FakeRuntime:
    """A runtime whose keys gate settles over SlowLimiter (and spools for real)."""

    def __init__(self, limiter, spool) -> None:
        # Connect on first use: never here.
        self.gate = KeyGate(resp_client(), request_resp_client(), spool=spool)
        self.gate.limiter = limiter


def call_for(runtime) -> CompletionState:
    call = CompletionState(Endpoint.CHAT, {"headers": []}, None, None)
    call.key = make_key_record()
    return call


@pytest.mark.parametrize("fails", [False, True], ids=["then-stored", "then-failed"])
def test_a_relay_cancelled_while_its_settle_call_goes_out_loses_no_record(tmp_path, fails):
    """The client leaves (or the time runs out) at [DONE], just as the settle call waits on a
    reconnect: the call must go on, and a failure of it must be spooled, not dropped."""
    spool = Spool(tmp_path)

    async def scenario():
        runtime = FakeRuntime(SlowLimiter(fails=fails), spool)
        call = call_for(runtime)
        lease = runtime.gate.lease(
            call.key,
            request_id=call.request_id,
            usage=functools.partial(settlement.usage_record, call),
        )

        async def relay():
            async with lease:
                await lease.submit()

        relaying = asyncio.ensure_future(relay())
        await asyncio.sleep(0)
        relaying.cancel()
        runtime.gate.limiter.release.set()
        with pytest.raises(asyncio.CancelledError):
            await relaying  # the lease's exit waited for the call, then let the cancel go on
        return runtime.gate.limiter.calls, call

    calls, call = asyncio.run(scenario())
    assert calls == 1
    spooled = [entry for path in tmp_path.glob("*") for entry in read_entries(path)[0]]
    assert call.outcome is UsageStatus.OK  # decided at [DONE], as the call went out
    if fails:
        assert len(spooled) == 1 and call.request_id.encode() in spooled[0][1]
    else:
        assert spooled == []
    spool.close()


def test_a_request_cancelled_before_its_answer_is_settled_as_cut_off(tmp_path):
    """The gateway stops past its grace period while a request waits on its node: the lease's
    exit still settles it (its slot freed, its record kept), as interrupted."""
    spool = Spool(tmp_path)

    async def scenario():
        runtime = FakeRuntime(SlowLimiter(fails=False), spool)
        runtime.gate.limiter.release.set()
        call = call_for(runtime)
        waiting = asyncio.Event()

        async def request():
            async with runtime.gate.lease(
                call.key,
                request_id=call.request_id,
                usage=functools.partial(settlement.usage_record, call),
            ):
                waiting.set()
                await asyncio.Event().wait()  # the node's answer, never coming

        task = asyncio.ensure_future(request())
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return runtime.gate.limiter.calls, call

    calls, call = asyncio.run(scenario())
    assert calls == 1
    assert (call.outcome, call.http_status) == (UsageStatus.INTERRUPTED, 503)
    spool.close()


def test_large_requests_are_capped_per_key_and_per_process(settings):
    """One thread serves every key's large bodies: one key may hold two places, the process
    eight; past them, 429 and 503 with Retry-After instead of an unbounded queue."""
    settings.DMX_LARGE_BODY_PER_KEY = 2
    settings.DMX_LARGE_BODY_QUEUE = 3
    gate = threading.Event()

    async def scenario():
        runtime = GatewayRuntime()
        try:
            held = [
                asyncio.ensure_future(runtime.off_loop(gate.wait, owner=owner))
                for owner in (1, 1, 2)
            ]
            await asyncio.sleep(0)  # each starts and is counted before its first await
            with pytest.raises(RateLimitError) as per_key:
                await runtime.off_loop(gate.wait, owner=1)
            with pytest.raises(ServiceUnavailableError) as per_process:
                await runtime.off_loop(gate.wait, owner=3)
            gate.set()
            assert await asyncio.gather(*held) == [True, True, True]
            # Their places are free by now: off_loop's done callback is queued on the loop
            # before the result it was awaiting (callbacks run in the order they were added).
            assert await runtime.off_loop(lambda: "served", owner=3) == "served"
            return per_key.value, per_process.value
        finally:
            gate.set()
            runtime._large.shutdown(wait=True)

    per_key, per_process = asyncio.run(scenario())
    assert per_key.status == 429 and "Retry-After" in per_key.headers
    assert per_process.status == 503 and "Retry-After" in per_process.headers
