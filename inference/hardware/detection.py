"""Detect this node's hardware: every GPU through NVML, or the CPU where there is none.

`get_gpu_info()` is the one call: it returns a `NodeView` of kind "gpu" with one `GpuInfo` per
GPU, the same fields on every SKU, or of kind "cpu" where NVML has no library, no driver or no
device. A field NVML cannot read on a given GPU (ECC on a GeForce, power in some VMs) is None,
as nvidia-smi shows "N/A"; the rest of the GPU is still reported.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from inference.hardware.nvml import (
    CLOCK_MEMORY,
    CLOCK_SM,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    NVLINK_MAX_LINKS,
    NVLINK_REMOTE_TYPES,
    TOPOLOGY_LEVELS,
    NvmlBackend,
    decode_clock_event_reasons,
    open_backend,
)
from inference.hardware.profiles import (
    CPU_PROFILE,
    Profile,
    load_profiles,
    match_profile,
    profile_named,
)
from inference.hardware.view import GpuInfo, NodeView, NvLink, PcieLink, ProfileRef

logger = logging.getLogger("dmx.hardware")

MIB = 1024 * 1024
# What NVML answers for a feature a GPU or its driver lacks: the field is N/A, not an error.
UNSUPPORTED = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLError_NotFound,
)
# A topology entry NVML could not give.
UNKNOWN_LINK = "?"

# Failures worth one warning per GPU and field, not one per heartbeat.
_warned: set[tuple[int, str]] = set()


def _read(call: Callable[..., Any], *args: Any, index: int, what: str) -> Any:
    """Return one NVML reading, or None when NVML cannot give it."""
    try:
        return call(*args)
    except UNSUPPORTED:
        return None
    except pynvml.NVMLError as exc:
        if (index, what) not in _warned:
            _warned.add((index, what))
            logger.warning("NVML could not read %s of GPU %s: %s", what, index, exc)
        return None


def _meminfo_mb() -> dict[str, int]:
    values = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) // 1024
    except OSError:
        pass
    return values


def _host() -> dict[str, int]:
    memory = _meminfo_mb()
    return {
        "cpu_count": os.cpu_count() or 1,
        "memory_total_mb": memory.get("MemTotal", 0),
        "memory_available_mb": memory.get("MemAvailable", 0),
    }


def _ref(profile: Profile) -> ProfileRef:
    return ProfileRef(
        name=profile.name,
        display_name=profile.display_name,
        hourly_price_usd=profile.hourly_price_usd,
        generic=profile.generic,
    )


def cpu_view() -> NodeView:
    """Return the CPU node's view: cores, memory and the CPU profile."""
    cpu = profile_named(CPU_PROFILE)
    return NodeView(kind="cpu", profile=_ref(cpu) if cpu else None, **_host())


@functools.lru_cache(maxsize=64)
def _profile_for(
    name: str, memory_mb: int, cc: tuple[int, int], profiles: tuple[Profile, ...]
) -> Profile:
    # Cached: a GPU's identity does not change, and an unknown one is warned about once.
    return match_profile(
        name=name, memory_mb=memory_mb, compute_capability=cc, profiles=profiles
    ).profile


def normalize_bus_id(bus_id: str) -> str:
    """Return a PCI bus id in NVML's form, 8-digit domain: "0000:18:00.0" -> "00000000:18:00.0"."""
    parts = bus_id.strip().upper().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return bus_id.strip().upper()
    domain, bus, function = parts
    return f"{int(domain, 16):08X}:{bus}:{function}"


def _nvlinks(backend: NvmlBackend, index: int, bus_ids: dict[str, int]) -> list[NvLink]:
    links = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            active = bool(backend.nvlink_state(index, link))
        except pynvml.NVMLError:
            break  # links are numbered from 0: the first one NVML refuses is past the last
        remote_bus = None
        remote = "unknown"
        if active:
            raw = _read(backend.nvlink_remote_pci_bus_id, index, link, index=index, what="nvlink")
            remote_bus = normalize_bus_id(raw) if raw else None
            kind = _read(backend.nvlink_remote_type, index, link, index=index, what="nvlink type")
            if kind is not None:
                remote = NVLINK_REMOTE_TYPES.get(kind, "unknown")
            elif remote_bus in bus_ids:  # older drivers: a local GPU's bus id says enough
                remote = "gpu"
        links.append(
            NvLink(
                link=link,
                active=active,
                remote=remote,
                remote_pci_bus_id=remote_bus,
                peer=bus_ids.get(remote_bus) if remote == "gpu" else None,
            )
        )
    return links


def _gpu(
    backend: NvmlBackend, index: int, bus_ids: dict[str, int], profiles: tuple[Profile, ...]
) -> GpuInfo:
    def read(call: Callable[..., Any], *args: Any, what: str) -> Any:
        return _read(call, index, *args, index=index, what=what)

    name = read(backend.name, what="name") or "unknown"
    cc = read(backend.compute_capability, what="compute capability")
    memory = read(backend.memory, what="memory")
    utilization = read(backend.utilization, what="utilisation")
    power = read(backend.power_usage, what="power")
    limit = read(backend.power_limit, what="power limit")
    reasons = read(backend.clock_event_reasons, what="clock event reasons")
    pcie = read(backend.pcie_link, what="PCIe link") or (None, None, None, None)
    bus_id = read(backend.pci_bus_id, what="PCI bus id")
    total_mb = memory[0] // MIB if memory else None
    profile = None
    if total_mb is not None and cc is not None:
        profile = _ref(_profile_for(name, total_mb, tuple(cc), profiles))
    return GpuInfo(
        index=index,
        name=name,
        uuid=read(backend.uuid, what="uuid"),
        pci_bus_id=normalize_bus_id(bus_id) if bus_id else None,
        profile=profile,
        compute_capability="{}.{}".format(*cc) if cc else None,
        memory_total_mb=total_mb,
        memory_used_mb=memory[1] // MIB if memory else None,
        memory_free_mb=memory[2] // MIB if memory else None,
        gpu_utilization=utilization[0] / 100 if utilization else None,
        memory_bandwidth_utilization=utilization[1] / 100 if utilization else None,
        temperature_c=read(backend.temperature, what="temperature"),
        power_draw_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        sm_clock_mhz=read(backend.clock, CLOCK_SM, what="SM clock"),
        memory_clock_mhz=read(backend.clock, CLOCK_MEMORY, what="memory clock"),
        throttle_reasons=decode_clock_event_reasons(reasons) if reasons is not None else None,
        ecc_corrected_volatile=read(backend.ecc_errors, ECC_CORRECTED, what="ECC"),
        ecc_uncorrected_volatile=read(backend.ecc_errors, ECC_UNCORRECTED, what="ECC"),
        pcie=PcieLink(generation=pcie[0], max_generation=pcie[1], width=pcie[2], max_width=pcie[3]),
        nvlinks=_nvlinks(backend, index, bus_ids),
    )


def _link(backend: NvmlBackend, first: GpuInfo, second: GpuInfo) -> str:
    """Return how two GPUs connect, as `nvidia-smi topo -m` prints it."""
    direct = sum(link.active and link.peer == second.index for link in first.nvlinks)
    if direct:
        return f"NV{direct}"
    # Through NVSwitches (HGX boards) every GPU reaches every other over all its switch links.
    switched = [
        sum(link.active and link.remote == "switch" for link in gpu.nvlinks)
        for gpu in (first, second)
    ]
    if min(switched):
        return f"NV{min(switched)}"
    level = _read(
        backend.topology_common_ancestor, first.index, second.index, index=first.index, what="topo"
    )
    return TOPOLOGY_LEVELS.get(level, UNKNOWN_LINK)


def visible_indices(backend: NvmlBackend, visible: str | None) -> list[int]:
    """Return the NVML indices CUDA_VISIBLE_DEVICES leaves visible, in its order.

    Entries are indices or UUID prefixes; as in CUDA, the first entry that names no GPU ends
    the list (so "" and "-1" hide them all). Indices are taken in NVML's PCI order: set
    CUDA_DEVICE_ORDER=PCI_BUS_ID, or use UUIDs, for CUDA to agree.
    """
    count = backend.device_count()
    if visible is None:
        return list(range(count))
    uuids = {i: _read(backend.uuid, i, index=i, what="uuid") or "" for i in range(count)}
    chosen: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            index = int(entry)
        else:
            found = [i for i, uuid in uuids.items() if entry and uuid.startswith(entry)]
            if len(found) != 1:
                break
            index = found[0]
        if index in chosen:
            break
        chosen.append(index)
    return chosen


def get_gpu_info(
    *,
    backend: NvmlBackend | None = None,
    visible: str | None = None,
    profiles: Sequence[Profile] | None = None,
) -> NodeView:
    """Return this node's view: its GPUs (those `visible` names, as in CUDA_VISIBLE_DEVICES).

    Pass an open backend to keep NVML initialised between calls (the worker's heartbeats);
    without one, NVML is opened and closed around this call. With no GPU, the CPU's view.
    """
    owned = backend is None
    if owned:
        backend = open_backend()
        if backend is None:
            return cpu_view()
    try:
        indices = visible_indices(backend, visible)
        if not indices:
            return cpu_view()
        known = tuple(profiles) if profiles is not None else load_profiles()
        bus_ids = {}
        for index in range(backend.device_count()):
            bus_id = _read(backend.pci_bus_id, index, index=index, what="PCI bus id")
            if bus_id:
                bus_ids[normalize_bus_id(bus_id)] = index
        gpus = [_gpu(backend, index, bus_ids, known) for index in indices]
        topology = [["X" if a is b else _link(backend, a, b) for b in gpus] for a in gpus]
        return NodeView(
            kind="gpu",
            driver_version=_read(backend.driver_version, index=-1, what="driver version"),
            gpus=gpus,
            topology=topology,
            **_host(),
        )
    finally:
        if owned:
            backend.close()
