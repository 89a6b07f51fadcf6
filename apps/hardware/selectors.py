"""Reads for hardware profiles."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.hardware.models import HardwareProfile


def hardware_profile_list() -> QuerySet[HardwareProfile]:
    """Every profile: GPUs by name, then the CPU."""
    return HardwareProfile.objects.order_by("-kind", "name")


def hardware_profile_find(*, name: str) -> HardwareProfile | None:
    return HardwareProfile.objects.filter(name=name).first()
