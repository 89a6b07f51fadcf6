"""A node's resources as the worker reports them and the platform reads them: CPU or GPUs.

One structure for every node, so that the router sees a T4, an H200 and a laptop the same way:
the worker sends `NodeView.to_dict()` as `resources` in its registration and every heartbeat,
the platform parses it back with `NodeView.from_dict` (apps.hardware.resources). Fields NVML
cannot read on a given GPU are None, never guessed.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from inference.wire import Message, WireError

NodeKind = Literal["cpu", "gpu"]
# How an NVLink's far end is reported (nvmlDeviceGetNvLinkRemoteDeviceType).
NvLinkRemote = Literal["gpu", "switch", "cpu", "unknown"]


class ProfileRef(Message):
    """The hardware profile a device matched, with the default price the worker knows of."""

    name: str
    display_name: str = ""
    hourly_price_usd: float = 0.0
    generic: bool = False


class PcieLink(Message):
    generation: int | None = None
    max_generation: int | None = None
    width: int | None = None
    max_width: int | None = None


class NvLink(Message):
    link: int
    active: bool
    remote: NvLinkRemote = "unknown"
    remote_pci_bus_id: str | None = None
    peer: int | None = None  # index of the GPU at the far end, when it is one of this node's


class GpuInfo(Message):
    """One GPU as NVML sees it; utilisations are fractions 0..1, memory in MiB as NVML reports."""

    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    profile: ProfileRef | None = None
    compute_capability: str | None = None
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    memory_free_mb: int | None = None
    # Fraction of the last sample period in which a kernel ran (NVML's "GPU utilisation").
    gpu_utilization: float | None = None
    # Fraction of the sample period in which device memory was read or written.
    memory_bandwidth_utilization: float | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: list[str] | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    pcie: PcieLink = msgspec.field(default_factory=PcieLink)
    nvlinks: list[NvLink] = []

    @property
    def memory_used_fraction(self) -> float | None:
        if not self.memory_total_mb or self.memory_used_mb is None:
            return None
        return self.memory_used_mb / self.memory_total_mb

    @property
    def active_nvlinks(self) -> int:
        return sum(link.active for link in self.nvlinks)


class NodeView(Message):
    """What a node has: host CPU and memory always, its GPUs and their topology when any."""

    kind: NodeKind
    cpu_count: int = 1
    memory_total_mb: int = 0
    memory_available_mb: int = 0
    driver_version: str | None = None
    # The CPU profile on a node without GPUs; GPU nodes carry one per GPU.
    profile: ProfileRef | None = None
    gpus: list[GpuInfo] = []
    # Between GPU i and j, as `nvidia-smi topo -m` writes it: "X" on the diagonal, "NV<n>" for n
    # NVLinks, else the closest common PCIe ancestor: "PIX", "PXB", "PHB", "NODE", "SYS".
    topology: list[list[str]] = []

    def __post_init__(self) -> None:
        if self.topology and len(self.topology) != len(self.gpus):
            raise WireError("topology", "must have one row per GPU")

    def nvlinked(self, i: int, j: int) -> bool:
        """True when GPUs i and j (positions in `gpus`) talk over NVLink."""
        return i == j or (bool(self.topology) and self.topology[i][j].startswith("NV"))
