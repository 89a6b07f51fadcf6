"""Replay recorded NVML readings (tests/inference/fixtures/nvml/) through the NVML interface."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pynvml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
T4 = "t4-x1-busy.json"
A100_X8 = "a100-sxm4-80gb-x8-idle.json"
H100_X8 = "h100-sxm-x8-busy.json"
H200_X8 = "h200-x8-loaded.json"
ALL = (T4, A100_X8, H100_X8, H200_X8)


def recording(name: str) -> dict[str, Any]:
    """Return a fixture's readings, a fresh copy a test may edit."""
    return copy.deepcopy(json.loads((FIXTURES / name).read_text()))


def nvml_error(name: str) -> pynvml.NVMLError:
    """Return the pynvml exception NVML raises for an error name such as "NotSupported"."""
    return getattr(pynvml, f"NVMLError_{name}")()


class ReplayBackend:
    """An NvmlBackend answering from recorded readings; raises what NVML would."""

    def __init__(self, readings: dict[str, Any]) -> None:
        self.readings = readings
        self.closed = False

    def _get(self, value: Any) -> Any:
        if isinstance(value, dict) and "nvml_error" in value:
            raise nvml_error(value["nvml_error"])
        return value

    def _device(self, index: int) -> dict[str, Any]:
        devices = self.readings["devices"]
        if not 0 <= index < len(devices):
            raise nvml_error("InvalidArgument")
        return devices[index]

    def _field(self, index: int, name: str) -> Any:
        return self._get(self._device(index).get(name, {"nvml_error": "NotSupported"}))

    def driver_version(self) -> str:
        return self._get(self.readings["driver_version"])

    def device_count(self) -> int:
        return len(self.readings["devices"])

    def name(self, index: int) -> str:
        return self._field(index, "name")

    def uuid(self, index: int) -> str:
        return self._field(index, "uuid")

    def pci_bus_id(self, index: int) -> str:
        return self._field(index, "pci_bus_id")

    def compute_capability(self, index: int) -> tuple[int, int]:
        return tuple(self._field(index, "compute_capability"))

    def memory(self, index: int) -> tuple[int, int, int]:
        memory = self._field(index, "memory")
        return memory["total"], memory["used"], memory["free"]

    def utilization(self, index: int) -> tuple[int, int]:
        rates = self._field(index, "utilization")
        return rates["gpu"], rates["memory"]

    def temperature(self, index: int) -> int:
        return self._field(index, "temperature")

    def power_usage(self, index: int) -> int:
        return self._field(index, "power_usage")

    def power_limit(self, index: int) -> int:
        return self._field(index, "power_limit")

    def clock(self, index: int, clock: int) -> int:
        clocks = self._field(index, "clocks")
        return self._get(clocks["sm" if clock == pynvml.NVML_CLOCK_SM else "mem"])

    def clock_event_reasons(self, index: int) -> int:
        return self._field(index, "clock_event_reasons")

    def ecc_errors(self, index: int, error_type: int) -> int:
        errors = self._field(index, "ecc_errors")
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self._get(errors["corrected" if corrected else "uncorrected"])

    def pcie_link(self, index: int) -> tuple[int, int, int, int]:
        pcie = self._field(index, "pcie")
        return pcie["generation"], pcie["max_generation"], pcie["width"], pcie["max_width"]

    def _link(self, index: int, link: int) -> dict[str, Any]:
        links = self._field(index, "nvlinks")
        if link >= len(links):
            raise nvml_error("NotSupported")
        return links[link]

    def nvlink_state(self, index: int, link: int) -> bool:
        return bool(self._get(self._link(index, link)["state"]))

    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str:
        return self._get(self._link(index, link)["remote_pci_bus_id"])

    def nvlink_remote_type(self, index: int, link: int) -> int:
        return self._get(self._link(index, link).get("remote_type", {"nvml_error": "NotSupported"}))

    def topology_common_ancestor(self, first: int, second: int) -> int:
        return self._get(self.readings["topology"][first][second])

    def close(self) -> None:
        self.closed = True


def replay(name: str) -> ReplayBackend:
    return ReplayBackend(recording(name))
