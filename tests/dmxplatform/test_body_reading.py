"""Reading request bodies as ASGI delivers them: an upload that stalls or drips is refused with
a 408 that closes the connection, as a prompt's body is; a steady one of any length is read."""

from __future__ import annotations

import asyncio
import time

import pytest

from dmxplatform.errors import RequestTimeoutError
from dmxplatform.responses import receive_upload


def dripping(pause: float, chunks: int, chunk: bytes = b"x"):
    """An ASGI receive callable: `chunks` chunks of the body, `pause` seconds apart."""
    sent = 0

    async def receive() -> dict:
        nonlocal sent
        await asyncio.sleep(pause)
        sent += 1
        return {"type": "http.request", "body": chunk, "more_body": sent < chunks}

    return receive


def upload(receive, *, within: float) -> tuple[bytes, float]:
    body = bytearray()
    started = time.monotonic()
    asyncio.run(receive_upload(receive, 10**6, body.extend, within=within))
    return bytes(body), time.monotonic() - started


def test_a_steady_upload_longer_than_the_idle_timeout_is_read_whole(settings):
    settings.DMX_BODY_READ_TIMEOUT_SECONDS = 0.5
    body, took = upload(dripping(0.05, 20), within=10)
    assert body == b"x" * 20 and took > settings.DMX_BODY_READ_TIMEOUT_SECONDS


def test_an_upload_that_stops_sending_is_a_408_after_the_idle_timeout(settings):
    settings.DMX_BODY_READ_TIMEOUT_SECONDS = 0.3
    with pytest.raises(RequestTimeoutError) as refused:
        upload(dripping(5, 2), within=60)
    assert "for 0.3 seconds" in refused.value.message
    assert refused.value.headers == {"Connection": "close"}


def test_an_upload_dripping_under_the_idle_timeout_is_a_408_at_its_deadline(settings):
    settings.DMX_BODY_READ_TIMEOUT_SECONDS = 1
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError) as refused:
        upload(dripping(0.1, 10**6), within=0.8)
    assert "within 0.8 seconds" in refused.value.message
    assert time.monotonic() - started < 5  # not the million chunks' 28 hours
