"""A batch worker's turn: take a batch no one holds, and validate, run or end it for up to
DMX_BATCH_SLICE_SECONDS. Lines go to the runner DMX_BATCH_CONCURRENCY at a time; each answer is
recorded as it comes, so a worker lost mid-turn loses only the lines it had in flight, which the
next worker runs (their first tries never settled: nothing was billed for them)."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import orjson
from django.conf import settings
from django.utils import timezone

from apps.batches import runner, services
from apps.batches.choices import BatchStatus
from apps.batches.models import Batch, BatchLine
from apps.keys.selectors import key_record_load

logger = logging.getLogger(__name__)
# How often a turn re-reads its batch (a cancel) and renews its hold, at most, seconds.
RENEW_SECONDS = 0.5
# Longest wait for a deferred line to come due or an answer to come, seconds.
WAIT_SECONDS = 1.0


def work_once() -> bool:
    """One turn on one batch; False when there was none to take."""
    batch = services.batch_hold()
    if batch is None:
        return False
    try:
        _turn(batch)
    finally:
        services.batch_release(batch)
    return True


def _turn(batch: Batch) -> None:
    if batch.status == BatchStatus.VALIDATING:
        services.batch_validate(batch)
        batch = services.batch_renew(batch)
    if batch.status == BatchStatus.FINALIZING:  # a turn lost while finalizing
        services.batch_end(batch)
        return
    if batch.status not in (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING):
        return
    key = key_record_load(batch.api_key.key_id)
    in_flight: dict[concurrent.futures.Future, BatchLine] = {}
    try:
        _run(batch, key, in_flight)
    finally:
        # Whatever ended the turn, lines already sent are recorded as they end: sent again by
        # the next turn, they would run (and be billed) twice.
        for future in concurrent.futures.as_completed(in_flight):
            _record(batch, in_flight[future], future)


def _run(batch: Batch, key, in_flight: dict[concurrent.futures.Future, BatchLine]) -> None:
    deadline = time.monotonic() + settings.DMX_BATCH_SLICE_SECONDS
    renewed = time.monotonic()
    while True:
        if time.monotonic() - renewed >= RENEW_SECONDS:
            batch, renewed = services.batch_renew(batch), time.monotonic()
        stopping = batch.status == BatchStatus.CANCELLING or batch.expires_at <= timezone.now()
        if not stopping and time.monotonic() < deadline and key is not None:
            room = settings.DMX_BATCH_CONCURRENCY - len(in_flight)
            for line in services.lines_claim(batch, room) if room > 0 else ():
                in_flight[runner.submit(key, batch.client_address, line)] = line
        if not in_flight:
            waiting, due_in = services.lines_waiting(batch)
            if stopping or not waiting:
                services.batch_end(batch)
                return
            if time.monotonic() >= deadline or key is None:
                return
            time.sleep(min(due_in if due_in is not None else 0.0, WAIT_SECONDS))
            continue
        done, _ = concurrent.futures.wait(
            in_flight, timeout=WAIT_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED
        )
        for future in done:
            _record(batch, in_flight.pop(future), future)


def _record(batch: Batch, line: BatchLine, future: concurrent.futures.Future) -> None:
    try:
        outcome = future.result()
    except Exception:
        logger.exception("batch %s line %s: the pipeline failed", batch.id, line.index)
        outcome = services.Outcome(500, _INTERNAL)
    services.line_record(line, outcome)


_INTERNAL = orjson.dumps(
    {"error": {"message": "The platform failed to run this request.", "type": "server_error"}}
)
