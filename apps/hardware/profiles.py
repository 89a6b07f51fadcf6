"""The hardware profile files (inference/hardware/profiles/*.yaml) into the database.

Shared by the service (apps.hardware.services.hardware_profiles_load) and the data migration
that gives a fresh database its profiles, so it works on a historical model too: it writes
only the fields the given model has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import models

from inference.hardware.profiles import Profile

PRICE = "hourly_price_usd"


@dataclass
class ProfilesLoaded:
    """What a load did, by profile name."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def profile_fields(profile: Profile) -> dict[str, Any]:
    """Return a profile's values as HardwareProfile fields (text columns take "" for none)."""
    return {
        "display_name": profile.display_name,
        "kind": profile.kind,
        "architecture": profile.architecture or "",
        "compute_capability": profile.compute_capability or "",
        "tensor_core_generation": profile.tensor_core_generation,
        "memory_gb": profile.memory_gb,
        "memory_bandwidth_gbps": profile.memory_bandwidth_gbps,
        "sm_count": profile.sm_count,
        "fp16_tflops": profile.fp16_tflops,
        "fp8_tflops": profile.fp8_tflops,
        "int8_tops": profile.int8_tops,
        "pcie_generation": profile.pcie_generation,
        "pcie_lanes": profile.pcie_lanes,
        "nvlink_bandwidth_gbps": profile.nvlink_bandwidth_gbps,
        "tdp_watts": profile.tdp_watts,
        PRICE: Decimal(str(profile.hourly_price_usd)),
        "nvml_names": list(profile.nvml_names),
        "datasheet": profile.datasheet,
    }


def profiles_sync(*, model: type[models.Model], profiles: Iterable[Profile]) -> ProfilesLoaded:
    """Create or update a row per profile; keep prices operators overrode. Idempotent."""
    columns = {f.name for f in model._meta.get_fields()}
    loaded = ProfilesLoaded()
    for profile in profiles:
        values = {k: v for k, v in profile_fields(profile).items() if k in columns}
        row = model.objects.filter(name=profile.name).first()
        if row is None:
            row = model(name=profile.name, **values)
            row.full_clean()
            row.save()
            loaded.created.append(profile.name)
            continue
        if getattr(row, "price_overridden", False):
            del values[PRICE]
        changed = [name for name, value in values.items() if getattr(row, name) != value]
        if not changed:
            loaded.unchanged.append(profile.name)
            continue
        for name in changed:
            setattr(row, name, values[name])
        row.full_clean()
        row.save(update_fields=changed)
        loaded.updated.append(profile.name)
    return loaded
