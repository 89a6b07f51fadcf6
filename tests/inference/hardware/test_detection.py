"""GPU detection over recorded NVML readings (tests/inference/fixtures/nvml/), and the CPU path."""

import json
import logging
from types import SimpleNamespace

import pynvml
import pytest

from inference.hardware import detection, nvml
from inference.hardware.detection import get_gpu_info, normalize_bus_id
from inference.hardware.nvml import decode_clock_event_reasons
from inference.hardware.view import NodeView
from tests.inference.hardware.nvml_replay import (
    A100_X8,
    ALL,
    H100_X8,
    H200_X8,
    T4,
    ReplayBackend,
    recording,
    replay,
)

MIB = 1024 * 1024


def view_of(readings: dict, **kwargs) -> NodeView:
    return get_gpu_info(backend=ReplayBackend(readings), **kwargs)


@pytest.mark.parametrize("fixture", ALL)
def test_every_sku_gives_the_same_structure(fixture):
    view = get_gpu_info(backend=replay(fixture))
    reference = get_gpu_info(backend=replay(T4)).to_dict()
    data = view.to_dict()
    assert data.keys() == reference.keys()
    assert all(gpu.keys() == reference["gpus"][0].keys() for gpu in data["gpus"])
    assert view.kind == "gpu" and len(view.gpus) == len(recording(fixture)["devices"])
    assert all(gpu.profile is not None and not gpu.profile.generic for gpu in view.gpus)
    # What the worker sends survives JSON and the platform's strict parser unchanged.
    assert NodeView.from_dict(json.loads(json.dumps(data))) == view


@pytest.mark.parametrize("fixture", ALL)
def test_readings_are_converted_to_the_views_units(fixture):
    view = get_gpu_info(backend=replay(fixture))
    for gpu, raw in zip(view.gpus, recording(fixture)["devices"], strict=True):
        assert gpu.name == raw["name"] and gpu.uuid == raw["uuid"]
        assert gpu.compute_capability == "{}.{}".format(*raw["compute_capability"])
        assert gpu.memory_total_mb == raw["memory"]["total"] // MIB
        assert gpu.memory_used_mb == raw["memory"]["used"] // MIB
        assert gpu.gpu_utilization == raw["utilization"]["gpu"] / 100
        assert gpu.memory_bandwidth_utilization == raw["utilization"]["memory"] / 100
        assert gpu.temperature_c == raw["temperature"]
        assert gpu.power_draw_w == raw["power_usage"] / 1000
        assert gpu.power_limit_w == raw["power_limit"] / 1000
        assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz) == (
            raw["clocks"]["sm"],
            raw["clocks"]["mem"],
        )
        assert gpu.throttle_reasons == decode_clock_event_reasons(raw["clock_event_reasons"])
        assert gpu.ecc_corrected_volatile == raw["ecc_errors"]["corrected"]
        assert gpu.pcie.generation == raw["pcie"]["generation"]
        assert gpu.pcie.max_width == raw["pcie"]["max_width"]
        assert len(gpu.nvlinks) == len(raw["nvlinks"])


def test_busy_t4_is_power_capped_and_has_no_nvlink():
    (gpu,) = get_gpu_info(backend=replay(T4)).gpus
    assert gpu.profile.name == "nvidia-t4"
    assert gpu.throttle_reasons == ["sw_power_cap"]
    assert gpu.nvlinks == [] and gpu.active_nvlinks == 0


def test_hot_h200_shows_its_thermal_slowdown():
    view = get_gpu_info(backend=replay(H200_X8))
    hottest = max(view.gpus, key=lambda gpu: gpu.temperature_c)
    assert "sw_thermal_slowdown" in hottest.throttle_reasons
    assert all(not gpu.throttle_reasons for gpu in view.gpus if gpu is not hottest)


def test_h200_and_h100_boards_are_told_apart():
    h200 = {gpu.profile.name for gpu in get_gpu_info(backend=replay(H200_X8)).gpus}
    h100 = {gpu.profile.name for gpu in get_gpu_info(backend=replay(H100_X8)).gpus}
    assert (h200, h100) == ({"nvidia-h200-sxm"}, {"nvidia-h100-sxm"})


def test_a100_40gb_and_80gb_are_told_apart(caplog):
    readings = recording(A100_X8)
    forty = 40 * 1024 * MIB
    for device in readings["devices"][:4]:  # a board of 40GB parts under the 80GB part's name
        device["memory"] = {"total": forty, "used": 4 * MIB, "free": forty - 4 * MIB}
    for device in readings["devices"][:2]:  # two of them named right
        device["name"] = "NVIDIA A100-SXM4-40GB"
    with caplog.at_level(logging.WARNING, logger="dmx.hardware"):
        profiles = [gpu.profile for gpu in view_of(readings).gpus]
    assert [p.name for p in profiles[:2]] == ["nvidia-a100-sxm4-40gb"] * 2
    assert all(p.generic for p in profiles[2:4])
    assert {p.name for p in profiles[4:]} == {"nvidia-a100-sxm4-80gb"}
    assert any("A100-SXM4-80GB" in record.message for record in caplog.records)


def test_unknown_gpu_gets_a_generic_profile_and_one_warning(caplog):
    readings = recording(T4)
    readings["devices"][0].update(name="NVIDIA L20", compute_capability=[8, 9])
    with caplog.at_level(logging.WARNING, logger="dmx.hardware"):
        first = view_of(readings).gpus[0]
        again = view_of(readings).gpus[0]  # a heartbeat later
    assert first.profile.generic and first.profile.name == "generic-nvidia-l20"
    assert first.profile.hourly_price_usd == 0.0
    assert again.profile == first.profile
    assert len([r for r in caplog.records if "NVIDIA L20" in r.message]) == 1


@pytest.mark.parametrize(("fixture", "links"), [(A100_X8, 12), (H100_X8, 18), (H200_X8, 18)])
def test_nvswitch_boards_connect_every_pair(fixture, links):
    view = get_gpu_info(backend=replay(fixture))
    count = len(view.gpus)
    assert all(gpu.active_nvlinks == links for gpu in view.gpus)
    assert all(link.remote == "switch" and link.peer is None for link in view.gpus[0].nvlinks)
    for i in range(count):
        for j in range(count):
            assert view.topology[i][j] == ("X" if i == j else f"NV{links}")
            assert view.nvlinked(i, j)


def test_links_down_show_in_state_and_topology():
    readings = recording(H100_X8)
    for link in readings["devices"][2]["nvlinks"][:2]:
        link["state"] = 0
    view = view_of(readings)
    assert view.gpus[2].active_nvlinks == 16
    assert view.topology[2][5] == view.topology[5][2] == "NV16"
    assert view.topology[0][1] == "NV18"
    assert [link.remote_pci_bus_id for link in view.gpus[2].nvlinks[:2]] == [None, None]


def bridged_pair() -> dict:
    """Two A100 PCIe GPUs joined by NVLink bridges, and a third on PCIe only."""
    readings = recording(A100_X8)
    devices = readings["devices"][:3]
    for device in devices:
        device["name"] = "NVIDIA A100 80GB PCIe"
    first, second, third = devices
    for device, other in ((first, second), (second, first)):
        device["nvlinks"] = [
            {"state": 1, "remote_type": 0, "remote_pci_bus_id": other["pci_bus_id"].lower()}
            for _ in range(12)
        ]
    third["nvlinks"] = []
    readings["devices"] = devices
    readings["topology"] = [row[:3] for row in readings["topology"][:3]]
    return readings


def test_direct_nvlink_peers_and_pcie_levels():
    view = view_of(bridged_pair())
    assert {link.peer for link in view.gpus[0].nvlinks} == {1}
    assert {link.remote for link in view.gpus[1].nvlinks} == {"gpu"}
    levels = recording(A100_X8)["topology"]
    expected = nvml.TOPOLOGY_LEVELS[levels[0][2]]
    assert view.topology == [
        ["X", "NV12", expected],
        ["NV12", "X", nvml.TOPOLOGY_LEVELS[levels[1][2]]],
        [expected, nvml.TOPOLOGY_LEVELS[levels[2][1]], "X"],
    ]
    assert view.nvlinked(0, 1) and not view.nvlinked(0, 2)


def test_peer_found_by_bus_id_when_the_driver_cannot_say_what_is_remote():
    readings = bridged_pair()
    for device in readings["devices"]:
        for link in device["nvlinks"]:
            link["remote_type"] = {"nvml_error": "NotSupported"}
    view = view_of(readings)
    assert {(link.remote, link.peer) for link in view.gpus[1].nvlinks} == {("gpu", 0)}
    assert view.topology[0][1] == "NV12"


def test_fields_nvml_cannot_read_are_none_and_the_rest_is_kept(caplog):
    readings = recording(T4)
    device = readings["devices"][0]
    device["ecc_errors"] = {"corrected": {"nvml_error": "NotSupported"}, "uncorrected": 0}
    device["power_usage"] = {"nvml_error": "NoPermission"}
    device["temperature"] = {"nvml_error": "Unknown"}
    del device["clock_event_reasons"]
    with caplog.at_level(logging.WARNING, logger="dmx.hardware"):
        gpu = view_of(readings).gpus[0]
    assert (gpu.ecc_corrected_volatile, gpu.ecc_uncorrected_volatile) == (None, 0)
    assert gpu.power_draw_w is None and gpu.power_limit_w == device["power_limit"] / 1000
    assert gpu.temperature_c is None and gpu.throttle_reasons is None
    assert gpu.memory_total_mb == device["memory"]["total"] // MIB
    # Unsupported is normal (nvidia-smi's N/A); an unexpected error is worth a warning.
    warnings = [record.message for record in caplog.records]
    assert any("temperature" in message for message in warnings)
    assert not any("ECC" in message or "power" in message for message in warnings)


def test_visible_devices_narrow_the_view_as_cuda_does():
    readings = recording(H100_X8)
    assert [gpu.index for gpu in view_of(readings, visible="2,3").gpus] == [2, 3]
    uuid = readings["devices"][5]["uuid"]
    chosen = view_of(readings, visible=f"{uuid[:12]},1")
    assert [gpu.index for gpu in chosen.gpus] == [5, 1]
    assert chosen.topology == [["X", "NV18"], ["NV18", "X"]]
    # As in CUDA, the first entry naming no GPU ends the list; none left means the CPU.
    assert [gpu.index for gpu in view_of(readings, visible="4,99,5").gpus] == [4]
    assert view_of(readings, visible="").kind == "cpu"
    assert view_of(readings, visible="-1").kind == "cpu"


def test_an_open_backend_is_left_open_and_an_own_one_closed(monkeypatch):
    given = replay(T4)
    get_gpu_info(backend=given)
    assert not given.closed
    owned = replay(T4)
    monkeypatch.setattr(detection, "open_backend", lambda: owned)
    assert get_gpu_info().kind == "gpu" and owned.closed


def test_no_nvml_library_means_the_cpu_view(monkeypatch):
    def missing() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    view = get_gpu_info()
    assert view.kind == "cpu" and view.gpus == [] and view.topology == []
    assert view.cpu_count >= 1 and view.memory_total_mb > 0
    assert view.profile.name == "cpu" and view.profile.hourly_price_usd > 0


def test_no_devices_means_the_cpu_view_and_nvml_is_shut_down(monkeypatch):
    calls = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 0)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    assert get_gpu_info().kind == "cpu"
    assert calls == ["init", "shutdown"]


def test_clock_event_reasons_are_named():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x24) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert decode_clock_event_reasons(0x1001) == ["gpu_idle", "other_0x1000"]


def test_bus_ids_compare_in_one_form():
    assert normalize_bus_id("0000:18:00.0") == "00000000:18:00.0"
    assert normalize_bus_id("00000000:2a:00.0") == "00000000:2A:00.0"


def test_the_pynvml_backend_reads_what_the_replay_does(monkeypatch):
    """PynvmlBackend over a pynvml whose calls answer from a recording, handles being indices."""
    source = replay(H100_X8)

    def bus(value: str) -> SimpleNamespace:
        return SimpleNamespace(busId=value.encode())  # ctypes gives bytes

    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": source.device_count,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlSystemGetDriverVersion": source.driver_version,
        "nvmlDeviceGetName": source.name,
        "nvmlDeviceGetUUID": source.uuid,
        "nvmlDeviceGetPciInfo": lambda h: bus(source.pci_bus_id(h)),
        "nvmlDeviceGetCudaComputeCapability": source.compute_capability,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            **dict(zip(("total", "used", "free"), source.memory(h), strict=True))
        ),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(
            **dict(zip(("gpu", "memory"), source.utilization(h), strict=True))
        ),
        "nvmlDeviceGetTemperature": lambda h, sensor: source.temperature(h),
        "nvmlDeviceGetPowerUsage": source.power_usage,
        "nvmlDeviceGetEnforcedPowerLimit": source.power_limit,
        "nvmlDeviceGetClockInfo": source.clock,
        "nvmlDeviceGetCurrentClocksEventReasons": source.clock_event_reasons,
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: source.ecc_errors(h, kind),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: source.pcie_link(h)[0],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: source.pcie_link(h)[1],
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: source.pcie_link(h)[2],
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: source.pcie_link(h)[3],
        "nvmlDeviceGetNvLinkState": lambda h, link: int(source.nvlink_state(h, link)),
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: bus(
            source.nvlink_remote_pci_bus_id(h, link)
        ),
        "nvmlDeviceGetNvLinkRemoteDeviceType": source.nvlink_remote_type,
        "nvmlDeviceGetTopologyCommonAncestor": source.topology_common_ancestor,
    }
    for name, call in calls.items():
        monkeypatch.setattr(pynvml, name, call)
    real = get_gpu_info()
    replayed = get_gpu_info(backend=replay(H100_X8))
    assert real.kind == "gpu" and real.driver_version == replayed.driver_version
    assert (real.gpus, real.topology) == (replayed.gpus, replayed.topology)
