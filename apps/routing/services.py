"""Writes for routing: the table, canaries, breakers, the decision log, nightly weights."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.hardware.models import Node
from apps.hardware.nodestate import now
from apps.models.models import ModelVersion
from apps.models.services import (
    CanaryGates,
    model_version_canary_advance,
    model_version_canary_promote,
    model_version_canary_rollback,
    model_version_canary_start,
    model_version_lock,
)
from apps.routing.breaker import Breaker, BreakerState, breakers_key, probe_key
from apps.routing.choices import CanaryAction, RecomputationStatus
from apps.routing.decisions import DECISION_STREAM, DecisionEvent
from apps.routing.models import (
    CanaryEvent,
    RoutingDecision,
    RoutingRule,
    WeightRecomputation,
    WorkProfile,
)
from apps.routing.selectors import (
    VersionFigures,
    node_hourly_prices,
    route_figures,
    version_figures,
    work_groups,
)
from dmxplatform import streams
from dmxplatform.audit.entries import audit_changed, audited_update
from dmxplatform.redis_client import request_redis
from dmxplatform.versioned import VersionCounter

# Gateways reload their routing table when this moves (dispatcher.refresh).
ROUTING_TABLE_VERSION = VersionCounter("routing")
# A rule's new weight moves halfway from the old to what the figures say: one bad night cannot
# swing the table, a lasting difference still shows within days.
WEIGHT_SMOOTHING = 0.5
# Rules with fewer requests than this in the window keep their weight: too little evidence.
WEIGHT_MIN_REQUESTS = 50
WEIGHT_WINDOW = timedelta(hours=24)


def routing_table_invalidate() -> None:
    """Tell every gateway to reload the routing table once the transaction commits."""
    ROUTING_TABLE_VERSION.bump_on_commit()


def routing_rule_save(*, rule: RoutingRule) -> RoutingRule:
    rule.full_clean()
    rule.save()
    routing_table_invalidate()
    return rule


def routing_rule_delete(*, rule: RoutingRule) -> None:
    rule.delete()
    routing_table_invalidate()


def work_profiles_recompute(*, now: datetime | None = None) -> int:
    """Recompute the work profiles from the ledger's window and publish them with the routing
    table (every gateway reloads it); returns how many there are."""
    now = now or timezone.now()
    since = now - timedelta(hours=settings.DMX_WORK_PROFILES_WINDOW_HOURS)
    rows = [
        WorkProfile(
            model=group.model,
            intent=group.intent,
            api_key_id=group.api_key_id,
            requests=group.figures.requests,
            completion_p50=group.figures.completion_p50,
            completion_p95=group.figures.completion_p95,
            ttft_p50_ms=group.figures.ttft_p50_ms,
            ttft_p95_ms=group.figures.ttft_p95_ms,
            latency_p50_ms=group.figures.latency_p50_ms,
            latency_p95_ms=group.figures.latency_p95_ms,
            computed_at=now,
        )
        for group in work_groups(since=since)
    ]
    with transaction.atomic():
        WorkProfile.objects.all().delete()
        WorkProfile.objects.bulk_create(rows)
        routing_table_invalidate()
    return len(rows)


def breaker_reset(*, node_id: int) -> None:
    """Close a node's breaker by hand; gateways pick it up at their next refresh."""
    client = request_redis()
    raw = client.hget(breakers_key(), str(node_id))
    client.hdel(breakers_key(), str(node_id))
    client.delete(probe_key(node_id))
    # The breaker is kept in Redis, not in the node's row, so no signal tells the audit log.
    node = Node.objects.filter(id=node_id).first()
    if raw is not None and node is not None:
        breaker = Breaker.parse(raw)
        state = breaker.current(now(), settings.DMX_BREAKER_COOLDOWN_SECONDS)
        audit_changed(
            node,
            {"breaker": (state, BreakerState.CLOSED), "breaker_failures": (breaker.failures, 0)},
        )


# Canaries --------------------------------------------------------------------------------------
# The versions' canary fields are the model registry's to change (apps.models.services); what
# routing adds is the log of each move (CanaryEvent), with the traffic figures it was made on.


def _canary_event(
    version: ModelVersion, action: str, figures: dict, *, automatic: bool, operator=None
) -> CanaryEvent:
    return CanaryEvent.objects.create(
        version=version, action=action, automatic=automatic, figures=figures, operator=operator
    )


@transaction.atomic
def canary_start(
    *,
    version: ModelVersion,
    percent: Decimal | float,
    steps: Sequence[Decimal | float] = (),
    gates: CanaryGates | None = None,
    operator=None,
) -> ModelVersion:
    """Start a canary on its ramp and gates (model_version_canary_start), recorded as the
    operator's."""
    version = model_version_canary_start(version=version, percent=percent, steps=steps, gates=gates)
    figures = {"steps": version.canary_steps, "gates": CanaryGates.of(version).as_dict()}
    _canary_event(version, CanaryAction.START, figures, automatic=False, operator=operator)
    return version


def _canary_moved_by_operator(
    move: Callable[..., ModelVersion], action: str, version: ModelVersion, operator
) -> CanaryEvent:
    """Make an operator's move (promotion, rollback), recorded with the canary's figures since
    it started."""
    version = move(version=version)
    figures = version_figures(version=version, since=version.canary_started_at).as_dict()
    return _canary_event(version, action, figures, automatic=False, operator=operator)


@transaction.atomic
def canary_promote(*, version: ModelVersion, operator=None) -> CanaryEvent:
    """Make a canary the model's only stable version (a 400 if it is no longer a canary)."""
    return _canary_moved_by_operator(
        model_version_canary_promote, CanaryAction.PROMOTE, version, operator
    )


@transaction.atomic
def canary_rollback(*, version: ModelVersion, operator=None) -> CanaryEvent:
    """Take all traffic off a canary; its nodes stay up for an operator to inspect (a 400 if
    it is no longer a canary)."""
    return _canary_moved_by_operator(
        model_version_canary_rollback, CanaryAction.ROLLBACK, version, operator
    )


def _stable_figures(version: ModelVersion, since: datetime) -> VersionFigures:
    parts = [
        version_figures(version=stable, since=since)
        for stable in ModelVersion.objects.filter(model=version.model, is_stable=True)
    ]
    latencies = [p.latency_p95_ms for p in parts if p.latency_p95_ms is not None]
    return VersionFigures(
        requests=sum(p.requests for p in parts),
        errors=sum(p.errors for p in parts),
        latency_p95_ms=max(latencies) if latencies else None,
    )


@transaction.atomic
def canary_evaluate(*, version_id: int) -> CanaryEvent | None:
    """Judge a canary's current step of its ramp once it has served its gate's requests:
    advance to the next step when it passes its gates, promote after the last step, roll back
    when a gate fails. Before the step's minimum requests, nothing.

    A step passes when, over its own window, its P95 latency is within the gate's bound (without
    one, no worse than the stable versions' by more than a tenth) and its error rate is no worse
    than theirs plus the gate's tolerance.
    """
    # Locked until this evaluation commits: an operator's promotion or rollback (which lock the
    # row too and re-check it) or a second evaluation waits for it, and then finds what it did;
    # one that committed first is what this one reads. Everything below judges this locked
    # instance, and the move it makes finds the row locked by this transaction already.
    version = model_version_lock(version_id=version_id)
    if not version.is_canary or version.canary_started_at is None:
        return None
    since = version.canary_step_started_at or version.canary_started_at
    gates = CanaryGates.of(version)
    canary = version_figures(version=version, since=since)
    if canary.requests < gates.min_requests:
        return None
    stable = _stable_figures(version, since)
    target = gates.latency_p95_ms or (
        stable.latency_p95_ms * 1.1 if stable.latency_p95_ms else None
    )
    fast_enough = target is None or (
        canary.latency_p95_ms is not None and canary.latency_p95_ms <= target
    )
    reliable = canary.error_rate <= stable.error_rate + gates.error_tolerance
    figures = {
        "canary": canary.as_dict(),
        "stable": stable.as_dict(),
        "step": version.canary_step,
        "percent": float(version.canary_percent),
        "latency_target_ms": target,
        "error_tolerance": gates.error_tolerance,
    }
    if not (fast_enough and reliable):
        action, move = CanaryAction.ROLLBACK, model_version_canary_rollback
    # A canary started before ramps existed has no steps: its one step is its last.
    elif not version.canary_steps or version.canary_last_step:
        action, move = CanaryAction.PROMOTE, model_version_canary_promote
    else:
        action, move = CanaryAction.STEP, model_version_canary_advance
    return _canary_event(move(version=version), action, figures, automatic=True)


# The decision log ------------------------------------------------------------------------------


def _decision_store(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    rows, unreadable = [], {}
    for entry_id, payload in pairs:
        try:
            event = DecisionEvent.decode(payload)
        except (TypeError, ValueError) as exc:
            unreadable[entry_id] = f"unreadable routing decision: {exc}"
            continue
        rows.append(
            RoutingDecision(
                request_id=event.request_id,
                created_at=datetime.fromtimestamp(event.created_at, tz=UTC),
                requested_model=event.requested_model,
                model=event.model,
                intent=event.intent,
                intent_confidence=event.intent_confidence,
                intent_low_confidence=event.intent_low_confidence,
                priority=event.priority,
                outcome=event.outcome,
                chosen_node=event.chosen_node,
                chosen_version=event.chosen_version,
                candidates={
                    "pool": event.pool,
                    "fallback": event.fallback,
                    "nodes": event.candidates,
                },
                waited_ms=event.waited_ms,
                decision_us=event.decision_us,
            )
        )
    RoutingDecision.objects.bulk_create(rows, ignore_conflicts=True)
    return unreadable


def decisions_flush(*, shard: int | None = None) -> int:
    """Move buffered routing decisions (of one shard's stream, or of all) into the database."""
    return streams.flush(DECISION_STREAM, _decision_store, shard=shard)


def decisions_prune(*, older_than_days: int) -> int:
    cutoff = timezone.now() - timedelta(days=older_than_days)
    return RoutingDecision.objects.filter(created_at__lt=cutoff).delete()[0]


# Nightly weights -------------------------------------------------------------------------------


def _value(figures, best_latency: float | None, sla_ms: int | None) -> float:
    """What a route is worth per unit of money: success * speed ÷ cost (see weights_recompute)."""
    success = 1.0 - figures.errors / figures.requests
    target = sla_ms or best_latency
    speed = 1.0
    if target and figures.latency_p95_ms:
        speed = min(1.0, target / figures.latency_p95_ms)
    return success * speed / (figures.cost_per_1k_tokens or 1.0)


def weights_recompute(*, now: datetime | None = None) -> WeightRecomputation:
    """Recompute every routing rule's weight from the last 24 hours of usage.

    For each rule with at least WEIGHT_MIN_REQUESTS requests of its model (and intent):
        value  = success rate * min(1, latency target / P95 latency) / cost per 1K tokens
    where the latency target is the model's SLA, or the best P95 among the rules it competes
    with (same alias and intent), and the cost is GPU time at the nodes' hourly prices over the
    tokens served (1 when unknown, so cost then drops out). Within each alias and intent the
    targets are the values rescaled to keep the group's total weight, and each new weight is
        new = (1 - WEIGHT_SMOOTHING) * old + WEIGHT_SMOOTHING * target.
    Applied at once with DMX_ROUTING_WEIGHTS_AUTO_APPLY, otherwise proposed for approval.
    """
    until = now or timezone.now()
    since = until - WEIGHT_WINDOW
    prices = node_hourly_prices()
    groups: dict[tuple[str, str], list[RoutingRule]] = defaultdict(list)
    for rule in RoutingRule.objects.filter(is_active=True).select_related("model"):
        groups[(rule.alias, rule.intent)].append(rule)
    changes = []
    for rules in groups.values():
        figures = {
            rule.id: route_figures(rule=rule, since=since, until=until, prices=prices)
            for rule in rules
        }
        judged = [rule for rule in rules if figures[rule.id].requests >= WEIGHT_MIN_REQUESTS]
        latencies = [f.latency_p95_ms for f in figures.values() if f.latency_p95_ms]
        best = min(latencies) if latencies else None
        values = {
            rule.id: _value(figures[rule.id], best, rule.model.sla_latency_p95_ms)
            for rule in judged
        }
        budget = sum(rule.weight for rule in judged)
        total_value = sum(values.values())
        for rule in rules:
            new = rule.weight
            if rule.id in values and total_value > 0:
                target = budget * values[rule.id] / total_value
                new = round((1 - WEIGHT_SMOOTHING) * rule.weight + WEIGHT_SMOOTHING * target, 4)
            changes.append(
                {
                    "rule": rule.id,
                    "alias": rule.alias,
                    "intent": rule.intent,
                    "model": rule.model.name,
                    "old": rule.weight,
                    "new": new,
                    "figures": figures[rule.id].as_dict(),
                }
            )
    recomputation = WeightRecomputation.objects.create(
        window_start=since, window_end=until, status=RecomputationStatus.PROPOSED, changes=changes
    )
    if settings.DMX_ROUTING_WEIGHTS_AUTO_APPLY:
        weights_apply(recomputation=recomputation)
    return recomputation


def _recomputation_undecided(recomputation: WeightRecomputation) -> WeightRecomputation:
    """`recomputation` as it is now, its row locked until the transaction ends, refused unless
    still proposed: another operator may have decided it since it was read."""
    locked = WeightRecomputation.objects.select_for_update().get(id=recomputation.id)
    if locked.status != RecomputationStatus.PROPOSED:
        raise ValidationError(f"This recomputation was {locked.status} already.")
    return locked


@transaction.atomic
def weights_apply(*, recomputation: WeightRecomputation, operator=None) -> WeightRecomputation:
    """Write a recomputation's weights into the routing table."""
    recomputation = _recomputation_undecided(recomputation)
    for change in recomputation.changes:
        audited_update(RoutingRule.objects.filter(id=change["rule"]), weight=change["new"])
    recomputation.status = RecomputationStatus.APPLIED
    recomputation.decided_at = timezone.now()
    recomputation.decided_by = operator
    recomputation.save(update_fields=["status", "decided_at", "decided_by"])
    routing_table_invalidate()
    return recomputation


@transaction.atomic
def weights_reject(*, recomputation: WeightRecomputation, operator=None) -> WeightRecomputation:
    """Leave the routing table as it is and record that an operator said so."""
    recomputation = _recomputation_undecided(recomputation)
    recomputation.status = RecomputationStatus.REJECTED
    recomputation.decided_at = timezone.now()
    recomputation.decided_by = operator
    recomputation.save(update_fields=["status", "decided_at", "decided_by"])
    return recomputation
