"""A node's resource view summarised for routing and described for the admin."""

import logging
from statistics import fmean

from apps.hardware.resources import describe, summarize, view_profile
from inference.hardware.detection import get_gpu_info
from inference.hardware.profiles import profile_named
from tests.inference.hardware.nvml_replay import H100_X8, ReplayBackend, recording, replay


def h100_view() -> dict:
    return get_gpu_info(backend=replay(H100_X8)).to_dict()


def cpu_view(**overrides) -> dict:
    return {
        "kind": "cpu",
        "cpu_count": 8,
        "memory_total_mb": 16000,
        "memory_available_mb": 4000,
        "profile": {"name": "cpu", "hourly_price_usd": 0.1},
        **overrides,
    }


def test_cpu_view():
    assert summarize(cpu_view()) == {
        "gpu_count": 0,
        "memory_used_fraction": 0.75,  # 1 - 4000 / 16000
        "hourly_price_usd": 0.1,
    }
    assert summarize(cpu_view(), unit_price_usd=0.25)["hourly_price_usd"] == 0.25
    # What older workers send: no memory figures, no profile.
    assert summarize({"kind": "cpu", "cpu_count": 2}) == {
        "gpu_count": 0,
        "memory_used_fraction": 0.0,
        "hourly_price_usd": 0.0,
    }
    assert view_profile(cpu_view()) == "cpu"


def test_eight_h100s():
    raw = recording(H100_X8)["devices"]
    summary = summarize(h100_view())
    mib = 1024 * 1024
    fullest = max((d["memory"]["used"] // mib) / (d["memory"]["total"] // mib) for d in raw)
    price = profile_named("nvidia-h100-sxm").hourly_price_usd
    assert summary == {
        "gpu_count": 8,
        "memory_used_fraction": round(fullest, 4),
        "gpu_utilization": round(fmean(d["utilization"]["gpu"] / 100 for d in raw), 4),
        "memory_bandwidth_utilization": max(d["utilization"]["memory"] for d in raw) / 100,
        "temperature_c": float(max(d["temperature"] for d in raw)),
        "hourly_price_usd": round(8 * price, 4),
    }
    assert 0.0 < summary["gpu_utilization"] <= 1.0
    assert summarize(h100_view(), unit_price_usd=2.0)["hourly_price_usd"] == 16.0
    assert view_profile(h100_view()) == "nvidia-h100-sxm"


def test_unreadable_views_summarise_to_nothing(caplog):
    assert summarize({}) == {}
    with caplog.at_level(logging.WARNING):
        assert summarize({"kind": "gpu", "gpus": [{"index": "zero"}]}) == {}
    assert "unreadable node resources" in caplog.text
    assert view_profile({"kind": "tpu"}) is None


def test_generic_gpus_name_no_profile():
    readings = recording(H100_X8)
    for device in readings["devices"]:
        device["name"] = "NVIDIA H100 NVL"
    view = get_gpu_info(backend=ReplayBackend(readings)).to_dict()
    assert view_profile(view) is None
    assert summarize(view)["hourly_price_usd"] == 0.0  # unknown until an operator prices it


def test_admin_description():
    hardware = describe(h100_view())
    assert hardware.gpus == "8 x NVIDIA H100 80GB HBM3"
    assert hardware.nvlink == "all 144 links up"  # 8 GPUs x 18 links
    hottest = max(device["temperature"] for device in recording(H100_X8)["devices"])
    assert hardware.temperature.startswith(f"{hottest} C")
    readings = recording(H100_X8)
    readings["devices"][4]["nvlinks"][0]["state"] = 0
    down = describe(get_gpu_info(backend=ReplayBackend(readings)).to_dict())
    assert down.nvlink == "1 of 144 links down"
    assert describe(cpu_view()).gpus == "none (8 CPU cores)"
    assert describe({}).gpus == "-"
