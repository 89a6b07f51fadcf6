import asyncio

import pytest

from apps.routing.queueing import AdmissionQueues, QueueFull


def test_higher_tiers_are_woken_first_then_arrival_order():
    async def scenario():
        queues = AdmissionQueues()
        order = []

        async def waiter(name, priority):
            await queues.wait("m", priority, 5)
            order.append(name)

        tasks = [
            asyncio.create_task(waiter("batch-1", 0)),
            asyncio.create_task(waiter("standard-1", 1)),
            asyncio.create_task(waiter("priority-1", 2)),
            asyncio.create_task(waiter("standard-2", 1)),
        ]
        await asyncio.sleep(0.01)
        assert queues.ahead_of("m", 1) and not queues.ahead_of("m", 3)
        for _ in tasks:
            queues.wake("m")
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["priority-1", "standard-1", "standard-2", "batch-1"]


def test_timeout_and_bound(settings):
    settings.DMX_ADMISSION_QUEUE_MAX = 1

    async def scenario():
        queues = AdmissionQueues()
        first = asyncio.create_task(queues.wait("m", 1, 0.05))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await queues.wait("m", 1, 1)
        timed_out = await first
        return timed_out, queues.waiting("m")

    assert asyncio.run(scenario()) == (False, 0)
