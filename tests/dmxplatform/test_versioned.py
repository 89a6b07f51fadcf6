"""dmxplatform.versioned: a gateway's copy of database state is rebuilt when its counter moved,
and only then."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from dmxplatform.redis_client import sync_redis
from dmxplatform.versioned import VersionCounter, reloaded

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_redis")]


@dataclass
class Copy:
    version: int


def test_a_bump_lands_when_the_transaction_commits(django_capture_on_commit_callbacks):
    counter = VersionCounter("things")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        counter.bump_on_commit()
        assert sync_redis().get(counter.key) is None  # not before the commit
    assert len(callbacks) == 1
    assert int(sync_redis().get(counter.key)) == 1


def test_the_copy_is_rebuilt_only_when_the_counter_moved():
    loads: list[int] = []

    def load(version: int) -> Copy:
        loads.append(version)
        return Copy(version)

    async def scenario() -> None:
        first = await reloaded(Copy(-1), None, load)  # never read: built on the first refresh
        assert first == Copy(0) and loads == [0]
        assert await reloaded(first, None, load) is first  # no bump yet
        assert await reloaded(first, b"0", load) is first
        second = await reloaded(first, b"3", load)
        assert second == Copy(3) and loads == [0, 3]
        assert await reloaded(second, "3", load) is second

    asyncio.run(scenario())
