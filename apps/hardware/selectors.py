"""Reads for hardware profiles, nodes and what the fleet serves."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import QuerySet

from apps.hardware.fleet import NodeSnapshot, fleet_key, now
from apps.hardware.models import HardwareProfile, Node
from apps.models.selectors import llm_models_active
from dmxplatform.redis_client import sync_redis


def hardware_profile_list() -> QuerySet[HardwareProfile]:
    """Every profile: GPUs by name, then the CPU."""
    return HardwareProfile.objects.order_by("-kind", "name")


def hardware_profile_find(*, name: str) -> HardwareProfile | None:
    return HardwareProfile.objects.filter(name=name).first()


def node_list() -> QuerySet[Node]:
    """Every registered node, as the last nodes_sync left its row."""
    return Node.objects.select_related("model_version__model", "profile")


@dataclass(frozen=True, slots=True)
class ModelAvailability:
    name: str
    description: str
    owned_by: str
    context_length: int
    served: bool  # a node takes its requests now


def models_available() -> list[ModelAvailability]:
    """Every active model, and whether a node takes its requests now (the live fleet state
    gateways route on, not the rows, which lag it by a sync)."""
    moment = now()
    served = {
        node.model
        for node in map(NodeSnapshot.decode, sync_redis().hvals(fleet_key()))
        if node.is_live(now=moment, stale_after=settings.DMX_NODE_STALE_SECONDS)
    }
    return [
        ModelAvailability(
            name=model.name,
            description=model.description,
            owned_by=model.owned_by,
            context_length=model.max_context_tokens,
            served=model.name in served,
        )
        for model in llm_models_active().order_by("name")
    ]
