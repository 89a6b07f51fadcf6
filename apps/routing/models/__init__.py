"""Routing's models, one module per concern, re-exported here (as NetBox does)."""

from apps.routing.models.proxies import Canary, NodeBreaker
from apps.routing.models.routing import (
    CanaryEvent,
    RoutingDecision,
    RoutingRule,
    WeightRecomputation,
    WorkProfile,
)
from apps.routing.models.scaling import ScalingEvent, ScalingPolicy

__all__ = [
    "Canary",
    "CanaryEvent",
    "NodeBreaker",
    "RoutingDecision",
    "RoutingRule",
    "ScalingEvent",
    "ScalingPolicy",
    "WeightRecomputation",
    "WorkProfile",
]
