"""The admission queue of a saturated model: higher priority tiers go first, bounded, timed.

One per gateway process and model. A request that finds every node saturated waits here until a
request on the model finishes (or the state refresh shows new room), best tier first, then by
arrival; past the timeout it gets 503 with Retry-After. While anyone of a tier at least as high
waits, a newcomer queues too, so the order is kept.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import defaultdict

from django.conf import settings

from dmxplatform import metrics

_sequence = itertools.count()


class QueueFull(Exception):
    pass


class AdmissionQueues:
    def __init__(self) -> None:
        self._waiting: defaultdict[str, list[tuple[int, int, asyncio.Future]]] = defaultdict(list)

    def waiting(self, model: str) -> int:
        return len(self._waiting[model])

    def ahead_of(self, model: str, priority: int) -> bool:
        """Whether someone of this priority or higher already waits for the model."""
        return any(-p >= priority for p, _, future in self._waiting[model] if not future.done())

    async def wait(self, model: str, priority: int, max_wait: float) -> bool:
        """Wait for a turn; True when woken, False on timeout. Raises QueueFull."""
        heap = self._waiting[model]
        if len(heap) >= settings.DMX_ADMISSION_QUEUE_MAX:
            raise QueueFull(model)
        future = asyncio.get_running_loop().create_future()
        entry = (-priority, next(_sequence), future)
        heapq.heappush(heap, entry)
        depth = metrics.gateway_queue_depth.labels(model)
        depth.inc()
        try:
            await asyncio.wait_for(asyncio.shield(future), max_wait)
            return True
        except TimeoutError:
            return False
        finally:
            depth.dec()
            if not future.done():
                future.cancel()
            if entry in heap:
                heap.remove(entry)
                heapq.heapify(heap)

    def wake(self, model: str, count: int = 1) -> None:
        """Let the best `count` waiters try again (a request on the model just finished)."""
        heap = self._waiting.get(model)
        while heap and count > 0:
            _, _, future = heapq.heappop(heap)
            if not future.done():
                future.set_result(None)
                count -= 1

    def wake_all(self) -> None:
        """Fresh node state: everyone re-checks."""
        for model in list(self._waiting):
            self.wake(model, count=len(self._waiting[model]))
