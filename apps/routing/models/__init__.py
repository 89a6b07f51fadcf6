"""Routing's models, one module per concern, re-exported here (as NetBox does)."""

from apps.routing.models.routing import (
    CanaryEvent,
    RoutingDecision,
    RoutingRule,
    WeightRecomputation,
)
from apps.routing.models.scaling import ScalingEvent, ScalingPolicy

__all__ = [
    "CanaryEvent",
    "RoutingDecision",
    "RoutingRule",
    "ScalingEvent",
    "ScalingPolicy",
    "WeightRecomputation",
]
