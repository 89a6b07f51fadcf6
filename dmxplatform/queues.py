"""Celery's queues, by latency need: ledger and fleet work must not wait behind nightly jobs."""

from enum import StrEnum


class Queue(StrEnum):
    DEFAULT = "default"
    LEDGER = "ledger"
    FLEET = "fleet"
    # A batch worker runs lines for minutes at a time: its own workers, never in the way of
    # the ledger's flushes (deploy/kubernetes/base/batch-worker.yaml).
    BATCHES = "batches"
