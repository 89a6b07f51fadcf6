"""Put billing's Redis counters back after the request store lost its data (the help below)."""

from __future__ import annotations

from argparse import ArgumentParser, RawDescriptionHelpFormatter
from datetime import UTC, datetime
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError, DjangoHelpFormatter
from django.db.models import Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.billing.counters import period_bounds, period_ttl_ms
from apps.billing.models import Budget, UsageRecord
from apps.billing.money import to_micros
from apps.billing.services import balance_copies_drop, spend_restore, spend_restored

HELP = """\
Put billing's Redis counters back after the request store (DMX_REQUEST_REDIS_URL) lost its data.

When the request store comes back empty, the gateways count every budget's spend for the
current period from zero again, and seed each prepaid balance from PostgreSQL on its next
request. This command:

1. adds to each budget's spend counter for the current period what the usage records in
   PostgreSQL cost from the period's start up to --since, the moment the store came back
   empty (what the gateways counted after it is in the counter already). A counter is added
   to once: a second run, or one from another shell, adds nothing to it.
2. drops Redis's copy of every prepaid balance (under the account's lock), so that the next
   request seeds it from the database again, with the charges stored since.

Run it once the usage records of requests made before the loss are in PostgreSQL: after
`manage.py usage_replay` for events gateways could only log, once the flush has stored them
(dmx_stream_backlog_entries back near zero). Requests in flight while it runs can leave a
balance's copy off by what they reserved: the balance ledger check and
dmx_balance_shortfall_total tell. Only a store that lost its data needs it: on one that kept
it, step 1 would count the spend before --since twice.

  manage.py billing_rebuild_counters --since 2026-05-14T09:30:00Z --dry-run
  manage.py billing_rebuild_counters --since 2026-05-14T09:30:00Z
"""


class _Formatter(DjangoHelpFormatter, RawDescriptionHelpFormatter):
    """Django's option order, the description's lines as written."""


def _moment(text: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None:
        raise CommandError(f"--since: not a date and time: {text!r} (ISO 8601)")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs) -> ArgumentParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = _Formatter
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--since",
            required=True,
            type=_moment,
            help="when the request store came back empty, ISO 8601 (UTC unless it says)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be done, change nothing"
        )

    def handle(self, *args, since: datetime, dry_run: bool, **options) -> None:
        now = timezone.now()
        if since > now:
            raise CommandError(f"--since {since.isoformat()} is in the future")
        restored = already = 0
        for budget in Budget.objects.order_by("id"):
            label, start, end = period_bounds(budget.period, now)
            if since <= start:
                continue  # the whole period is counted in the counter already
            records = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=since)
            if budget.api_key_id:
                records = records.filter(api_key_id=budget.api_key_id)
            else:
                records = records.filter(tenant_id=budget.tenant_id)
            cost = records.aggregate(total=Sum("cost"))["total"] or Decimal(0)
            if not cost:
                continue
            where = f"budget {budget.id} ({budget}), period {label}: {cost} before --since"
            if dry_run:
                done = spend_restored(tenant_id=budget.tenant_id, budget_id=budget.id, label=label)
                self.stdout.write(f"{where}{' (added already)' if done else ''}")
                continue
            added = spend_restore(
                tenant_id=budget.tenant_id,
                budget_id=budget.id,
                label=label,
                micros=to_micros(cost),
                ttl_ms=period_ttl_ms(end, now),
            )
            restored += added
            already += not added
            self.stdout.write(f"{where}{' added' if added else ' (added already)'}")
        if dry_run:
            self.stdout.write("dry run: nothing changed; the balance copies would be dropped")
            return
        dropped = balance_copies_drop()
        self.stdout.write(
            f"spend added to {restored} budget counters ({already} had it already); "
            f"{dropped} prepaid balance copies dropped, seeded again on their next request"
        )
