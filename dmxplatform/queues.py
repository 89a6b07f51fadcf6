"""Celery's queues, by latency need: ledger and fleet work must not wait behind nightly jobs."""

from enum import StrEnum


class Queue(StrEnum):
    DEFAULT = "default"
    LEDGER = "ledger"
    FLEET = "fleet"
