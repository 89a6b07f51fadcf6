"""Append the usage records gateways could only log back to the usage stream.

A gateway that loses Redis mid-request logs the request's usage event as
`usage-unrecorded <json>` (apps/gateway/pipeline.py). Feed it the gateway logs:

manage.py usage_replay gateway.log [more.log ...]
journalctl -u dmx-gateway | manage.py usage_replay -

Celery's flush then stores them; a request already recorded is not stored twice.
"""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.billing.services import usage_replay


class Command(BaseCommand):
    help = "Append logged usage-unrecorded events to the usage stream again."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("logs", nargs="+", help="log files, or - for standard input")

    def handle(self, *args, logs: list[str], **options) -> None:
        appended = unreadable = 0
        for name in logs:
            try:
                if name == "-":
                    counts = usage_replay(sys.stdin)
                else:
                    with Path(name).open(encoding="utf-8", errors="replace") as lines:
                        counts = usage_replay(lines)
            except OSError as exc:
                raise CommandError(f"cannot read {name}: {exc}") from exc
            appended += counts[0]
            unreadable += counts[1]
        self.stdout.write(f"appended {appended} usage events; {unreadable} lines unreadable")
        if unreadable:
            self.stderr.write("unreadable lines were skipped: check them by hand")
