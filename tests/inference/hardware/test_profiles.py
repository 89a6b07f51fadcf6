import dataclasses
import logging

import pytest
import yaml

from inference.hardware.profiles import (
    PROFILES_DIR,
    SCHEMA,
    ProfileError,
    load_profile,
    load_profiles,
    match_profile,
    profile_from_dict,
)

# The SKUs the fleet is planned around; each must have a file.
REQUIRED = {
    "nvidia-t4",
    "nvidia-v100-sxm2-32gb",
    "nvidia-a10g",
    "nvidia-l4",
    "nvidia-l40s",
    "nvidia-a100-pcie-40gb",
    "nvidia-a100-sxm4-40gb",
    "nvidia-a100-pcie-80gb",
    "nvidia-a100-sxm4-80gb",
    "nvidia-h100-pcie",
    "nvidia-h100-sxm",
    "nvidia-h200-sxm",
    "nvidia-b200",
    "cpu",
}


def raw(name: str) -> dict:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


def profiles() -> dict:
    return {profile.name: profile for profile in load_profiles()}


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_file_matches_the_schema(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    numbers = {f.name: getattr(profile, f.name) for f in SCHEMA if f.type in (int, float) and f.low}
    for name, value in numbers.items():
        assert value is None or value > 0, name


def test_every_planned_sku_has_a_profile():
    assert set(profiles()) >= REQUIRED


def test_datasheet_figures_that_are_easy_to_get_wrong():
    known = profiles()
    figures = {
        name: (p.memory_gb, p.memory_bandwidth_gbps) for name, p in known.items() if p.kind == "gpu"
    }
    assert figures["nvidia-a100-sxm4-80gb"] == (80, 2039)
    assert figures["nvidia-a100-pcie-80gb"] == (80, 1935)
    assert figures["nvidia-h100-sxm"] == (80, 3350)
    assert figures["nvidia-h100-pcie"] == (80, 2000)
    assert figures["nvidia-h200-sxm"] == (141, 4800)
    assert figures["nvidia-t4"] == (16, 320)
    assert figures["nvidia-l4"] == (24, 300)
    assert figures["nvidia-a10g"] == (24, 600)
    assert figures["nvidia-l40s"] == (48, 864)
    assert figures["nvidia-v100-sxm2-32gb"] == (32, 900)
    assert figures["nvidia-b200"][1] == 8000 and figures["nvidia-b200"][0] in (180, 192)


def test_figures_are_plausible_together():
    for profile in load_profiles():
        if profile.kind == "cpu":
            assert profile.memory_gb is None and profile.nvml_names == ()
            continue
        # Dense FP8 doubles dense FP16 on every part that has it (Ada, Hopper, Blackwell).
        if profile.fp8_tflops is not None:
            assert 1.9 <= profile.fp8_tflops / profile.fp16_tflops <= 2.1, profile.name
        # GB/s per dense FP16 TFLOPS: between a compute-rich part (L40S) and a bandwidth-rich one.
        assert 0.5 <= profile.memory_bandwidth_gbps / profile.fp16_tflops <= 10, profile.name
        # Price follows capability: no GPU is priced like a CPU node.
        assert profile.hourly_price_usd > profiles()["cpu"].hourly_price_usd


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"memory_bandwidth_gbps": 3.35}, "outside"),  # TB/s written for GB/s
        ({"memory_gb": 81559}, "outside"),  # MiB written for GB
        ({"fp8_tflops": None}, "fp8_tflops"),  # Hopper has FP8
        ({"compute_capability": "8.0"}, "is not hopper"),
        ({"tensor_core_generation": 3}, "tensor_core_generation"),
        ({"sm_count": "132"}, "must be of type int"),
        ({"nvml_names": []}, "NVML name"),
        ({"flops": 1}, "unknown keys"),
        ({"kind": "tpu"}, "kind"),
    ],
)
def test_schema_rejects_bad_figures(change, message):
    data = {**raw("nvidia-h100-sxm"), **change}
    with pytest.raises(ProfileError, match=message):
        profile_from_dict(data)


def test_schema_requires_every_key():
    data = raw("nvidia-t4")
    del data["tdp_watts"]
    with pytest.raises(ProfileError, match="missing keys tdp_watts"):
        profile_from_dict(data)


def test_cpu_profile_has_no_gpu_figures():
    with pytest.raises(ProfileError, match="must be null on a CPU profile"):
        profile_from_dict({**raw("cpu"), "memory_gb": 64})


def test_file_name_must_be_the_profile_name(tmp_path):
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump(raw("nvidia-h100-sxm")))
    with pytest.raises(ProfileError, match="differs from the file name"):
        load_profile(path)


# Names, memory totals (MiB) and compute capabilities as NVML reports them.
@pytest.mark.parametrize(
    ("name", "memory_mb", "cc", "expected"),
    [
        ("Tesla T4", 15109, (7, 5), "nvidia-t4"),
        ("Tesla V100-SXM2-32GB", 32768, (7, 0), "nvidia-v100-sxm2-32gb"),
        ("NVIDIA A10G", 23028, (8, 6), "nvidia-a10g"),
        ("NVIDIA L4", 23034, (8, 9), "nvidia-l4"),
        ("NVIDIA L40S", 46068, (8, 9), "nvidia-l40s"),
        ("NVIDIA A100-PCIE-40GB", 40960, (8, 0), "nvidia-a100-pcie-40gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, (8, 0), "nvidia-a100-sxm4-40gb"),
        ("NVIDIA A100 80GB PCIe", 81920, (8, 0), "nvidia-a100-pcie-80gb"),
        ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), "nvidia-a100-sxm4-80gb"),
        ("NVIDIA H100 PCIe", 81559, (9, 0), "nvidia-h100-pcie"),
        ("NVIDIA H100 80GB HBM3", 81559, (9, 0), "nvidia-h100-sxm"),
        ("NVIDIA H200", 143771, (9, 0), "nvidia-h200-sxm"),
        ("NVIDIA B200", 183359, (10, 0), "nvidia-b200"),
    ],
)
def test_each_sku_matches_its_profile(name, memory_mb, cc, expected):
    match = match_profile(name=name, memory_mb=memory_mb, compute_capability=cc)
    assert (match.profile.name, match.generic) == (expected, False)


def test_name_memory_and_capability_must_all_agree(caplog):
    h200_memory, h100_memory = 143771, 81559
    # A name pattern loose enough to take both Hopper SXM parts still cannot confuse them.
    loose = [
        dataclasses.replace(p, nvml_names=("NVIDIA H*",))
        for p in load_profiles()
        if p.name in ("nvidia-h100-sxm", "nvidia-h200-sxm")
    ]
    for memory, expected in ((h200_memory, "nvidia-h200-sxm"), (h100_memory, "nvidia-h100-sxm")):
        match = match_profile(
            name="NVIDIA H200", memory_mb=memory, compute_capability=(9, 0), profiles=loose
        )
        assert match.profile.name == expected
    with caplog.at_level(logging.WARNING, logger="dmx.hardware"):
        # An A100 40GB that claimed the 80GB part's name would still not be priced as one.
        forty = match_profile(
            name="NVIDIA A100-SXM4-80GB", memory_mb=40960, compute_capability=(8, 0)
        )
        wrong_cc = match_profile(
            name="NVIDIA H100 80GB HBM3", memory_mb=81559, compute_capability=(8, 0)
        )
    assert forty.generic and wrong_cc.generic
    assert "nvidia-a100-sxm4-80gb" in forty.reason
    assert len([r for r in caplog.records if "has no hardware profile" in r.message]) == 2


def test_unknown_gpu_gets_a_generic_profile_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="dmx.hardware"):
        match = match_profile(
            name="NVIDIA RTX 6000 Ada Generation", memory_mb=49140, compute_capability=(8, 9)
        )
    profile = match.profile
    assert match.generic and profile.kind == "gpu"
    assert profile.name == "generic-nvidia-rtx-6000-ada-generation"
    assert (profile.memory_gb, profile.compute_capability) == (48.0, "8.9")
    assert profile.memory_bandwidth_gbps is None and profile.hourly_price_usd == 0.0
    assert any("RTX 6000 Ada" in record.message for record in caplog.records)
