"""A process's background loops (asyncio tasks that run until the process stops)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_all(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel the tasks and wait until each has finished (its cleanup run)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
