"""The few NVML calls the worker makes, behind one narrow interface.

Detection (inference.hardware.detection) talks only to an `NvmlBackend`: in production the
`PynvmlBackend` below, in tests a replay of recorded readings. Both raise pynvml's own
`NVMLError` subclasses, so per-field error handling is the same code for both.
"""

from __future__ import annotations

import logging
from typing import Protocol

import pynvml

logger = logging.getLogger("dmx.hardware")

# Links NVML can number on one GPU (18 on an H100 or B200, 12 on an A100, 6 on a V100).
NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

CLOCK_SM = pynvml.NVML_CLOCK_SM
CLOCK_MEMORY = pynvml.NVML_CLOCK_MEM
ECC_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
ECC_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED

# nvmlDeviceGetCurrentClocksEventReasons bits, named as nvidia-smi -q names them.
CLOCK_EVENT_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# nvmlDeviceGetTopologyCommonAncestor levels as `nvidia-smi topo -m` abbreviates them.
TOPOLOGY_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX",  # two GPUs on one board
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}

# nvmlDeviceGetNvLinkRemoteDeviceType values.
NVLINK_REMOTE_TYPES = {0: "gpu", 1: "cpu", 2: "switch"}


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Return the names of the reasons set in an NVML clock-event bit mask."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    if unknown := mask & ~sum(CLOCK_EVENT_REASONS):
        names.append(f"other_{unknown:#x}")
    return names


class NvmlBackend(Protocol):
    """The NVML reads detection needs; each raises pynvml.NVMLError when NVML cannot answer."""

    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def pci_bus_id(self, index: int) -> str: ...
    def compute_capability(self, index: int) -> tuple[int, int]: ...
    def memory(self, index: int) -> tuple[int, int, int]: ...  # total, used, free; bytes
    def utilization(self, index: int) -> tuple[int, int]: ...  # gpu, memory; percent
    def temperature(self, index: int) -> int: ...  # degrees C
    def power_usage(self, index: int) -> int: ...  # milliwatts
    def power_limit(self, index: int) -> int: ...  # milliwatts, the enforced limit
    def clock(self, index: int, clock: int) -> int: ...  # MHz
    def clock_event_reasons(self, index: int) -> int: ...  # bit mask
    def ecc_errors(self, index: int, error_type: int) -> int: ...  # volatile count
    def pcie_link(self, index: int) -> tuple[int, int, int, int]: ...  # gen, max gen, width, max
    def nvlink_state(self, index: int, link: int) -> bool: ...
    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str: ...
    def nvlink_remote_type(self, index: int, link: int) -> int: ...
    def topology_common_ancestor(self, first: int, second: int) -> int: ...
    def close(self) -> None: ...


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PynvmlBackend:
    """NVML through pynvml (nvidia-ml-py); raises NVMLError from the constructor if unusable."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._handles: dict[int, object] = {}

    def _handle(self, index: int) -> object:
        if index not in self._handles:
            self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def driver_version(self) -> str:
        return _text(pynvml.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        return pynvml.nvmlDeviceGetCount()

    def name(self, index: int) -> str:
        return _text(pynvml.nvmlDeviceGetName(self._handle(index)))

    def uuid(self, index: int) -> str:
        return _text(pynvml.nvmlDeviceGetUUID(self._handle(index)))

    def pci_bus_id(self, index: int) -> str:
        return _text(pynvml.nvmlDeviceGetPciInfo(self._handle(index)).busId)

    def compute_capability(self, index: int) -> tuple[int, int]:
        return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(self._handle(index)))

    def memory(self, index: int) -> tuple[int, int, int]:
        info = pynvml.nvmlDeviceGetMemoryInfo(self._handle(index))
        return info.total, info.used, info.free

    def utilization(self, index: int) -> tuple[int, int]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(self._handle(index))
        return rates.gpu, rates.memory

    def temperature(self, index: int) -> int:
        return pynvml.nvmlDeviceGetTemperature(self._handle(index), pynvml.NVML_TEMPERATURE_GPU)

    def power_usage(self, index: int) -> int:
        return pynvml.nvmlDeviceGetPowerUsage(self._handle(index))

    def power_limit(self, index: int) -> int:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle(index))

    def clock(self, index: int, clock: int) -> int:
        return pynvml.nvmlDeviceGetClockInfo(self._handle(index), clock)

    def clock_event_reasons(self, index: int) -> int:
        return pynvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle(index))

    def ecc_errors(self, index: int, error_type: int) -> int:
        return pynvml.nvmlDeviceGetTotalEccErrors(
            self._handle(index), error_type, pynvml.NVML_VOLATILE_ECC
        )

    def pcie_link(self, index: int) -> tuple[int, int, int, int]:
        handle = self._handle(index)
        return (
            pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
            pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
            pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
        )

    def nvlink_state(self, index: int, link: int) -> bool:
        state = pynvml.nvmlDeviceGetNvLinkState(self._handle(index), link)
        return state == pynvml.NVML_FEATURE_ENABLED

    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str:
        return _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(self._handle(index), link).busId)

    def nvlink_remote_type(self, index: int, link: int) -> int:
        return pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(self._handle(index), link)

    def topology_common_ancestor(self, first: int, second: int) -> int:
        return pynvml.nvmlDeviceGetTopologyCommonAncestor(self._handle(first), self._handle(second))

    def close(self) -> None:
        pynvml.nvmlShutdown()


def open_backend() -> NvmlBackend | None:
    """Return NVML ready to read, or None where there is no driver, library or GPU."""
    try:
        backend = PynvmlBackend()
    except pynvml.NVMLError as exc:
        logger.info("no NVIDIA GPU here (NVML: %s): reporting the CPU", exc)
        return None
    try:
        count = backend.device_count()
    except pynvml.NVMLError as exc:
        logger.warning("NVML initialised but cannot count GPUs (%s): reporting the CPU", exc)
        count = 0
    if count == 0:
        backend.close()
        return None
    return backend
