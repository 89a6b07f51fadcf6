"""Hardware profiles: one YAML file per accelerator SKU, checked against a schema written here.

The files in profiles/ are the source of the facts (datasheet numbers) and of each SKU's default
price; the worker matches its GPUs against them, the platform loads them into its database
(apps.hardware.profiles), where operators may override the price. No Django here.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger("dmx.hardware")

PROFILES_DIR = Path(__file__).with_name("profiles")
KINDS = ("gpu", "cpu")
CPU_PROFILE = "cpu"

# NVML reports memory in MiB; datasheets in GB that are GiB for HBM parts (A100 80GB shows
# 81920 MiB) and rather less for GDDR6 parts, where ECC and the driver keep some back (a T4
# "16 GB" shows 15110 MiB, 92%). Within this band of the datasheet figure a GPU is that SKU;
# half (A100 40 vs 80GB) or 1.76x (H200 vs H100) is far outside it.
MEMORY_MATCH_RANGE = (0.90, 1.05)


@dataclass(frozen=True, slots=True)
class Architecture:
    compute_capabilities: tuple[str, ...]
    tensor_core_generation: int


# What each architecture's compute capability and tensor cores are, to cross-check the files.
ARCHITECTURES = {
    "volta": Architecture(("7.0", "7.2"), 1),
    "turing": Architecture(("7.5",), 2),
    "ampere": Architecture(("8.0", "8.6", "8.7"), 3),
    "ada": Architecture(("8.9",), 4),
    "hopper": Architecture(("9.0",), 4),
    "blackwell": Architecture(("10.0", "10.3", "12.0"), 5),
}

# Compute capability from which BF16 and FP8 tensor cores exist (Ampere, Ada).
BF16_FROM = (8, 0)
FP8_FROM = (8, 9)


def parse_compute_capability(value: str) -> tuple[int, int]:
    """Return "9.0" as (9, 0)."""
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a profile file: its type, whether GPUs and CPUs need it, its plausible range."""

    name: str
    type: type
    gpu: bool = True  # required (not null) on GPU profiles; always null on the CPU profile
    nullable: bool = False  # may be null on a GPU profile too (FP8 on pre-Ada parts)
    low: float | None = None
    high: float | None = None


# The schema. Ranges are what any datacenter SKU from Volta to Blackwell could have: wide
# enough for the next generation, narrow enough to catch a unit slip (MB for GB, TB/s for GB/s).
SCHEMA = (
    Field("name", str, gpu=False),
    Field("display_name", str, gpu=False),
    Field("kind", str, gpu=False),
    Field("architecture", str),
    Field("compute_capability", str),
    Field("tensor_core_generation", int, low=1, high=9),
    Field("memory_gb", float, low=8, high=1024),
    Field("memory_bandwidth_gbps", float, low=100, high=30_000),
    Field("sm_count", int, low=16, high=512),
    Field("fp16_tflops", float, low=20, high=50_000),
    Field("fp8_tflops", float, nullable=True, low=100, high=100_000),
    Field("int8_tops", float, low=40, high=100_000),
    Field("pcie_generation", int, low=3, high=7),
    Field("pcie_lanes", int, low=4, high=16),
    Field("nvlink_bandwidth_gbps", float, low=0, high=10_000),  # 0: no NVLink
    Field("tdp_watts", int, low=40, high=2_000),
    Field("hourly_price_usd", float, gpu=False, low=0.01, high=100),
    Field("nvml_names", list, gpu=False),
    Field("datasheet", str, gpu=False),
)
ALWAYS_REQUIRED = ("name", "display_name", "kind", "hourly_price_usd", "nvml_names", "datasheet")
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
COMPUTE_CAPABILITY = re.compile(r"^\d+\.\d+$")


class ProfileError(ValueError):
    """A profile file does not match the schema."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One SKU's datasheet facts and default price; GPU figures are None on the CPU profile."""

    name: str
    display_name: str
    kind: str
    architecture: str | None
    compute_capability: str | None
    tensor_core_generation: int | None
    memory_gb: float | None
    memory_bandwidth_gbps: float | None
    sm_count: int | None
    fp16_tflops: float | None  # dense FP16 tensor; BF16 runs at the same rate where supported
    fp8_tflops: float | None
    int8_tops: float | None
    pcie_generation: int | None
    pcie_lanes: int | None
    nvlink_bandwidth_gbps: float | None
    tdp_watts: int | None
    hourly_price_usd: float  # per GPU; per node on the CPU profile
    nvml_names: tuple[str, ...]
    datasheet: str
    # Built from what NVML reports for a GPU no file describes; its datasheet figures are None.
    generic: bool = False

    @property
    def cc(self) -> tuple[int, int] | None:
        if self.compute_capability is None:
            return None
        return parse_compute_capability(self.compute_capability)

    def matches_name(self, nvml_name: str) -> bool:
        name = nvml_name.strip().casefold()
        return any(fnmatch.fnmatchcase(name, pattern.casefold()) for pattern in self.nvml_names)


def _checked(field: Field, value: Any, kind: str, where: str) -> Any:
    required = field.name in ALWAYS_REQUIRED or (kind == "gpu" and field.gpu and not field.nullable)
    if value is None:
        if required:
            raise ProfileError(f"{where}: {field.name} is required")
        return None
    if kind == "cpu" and field.gpu:
        raise ProfileError(f"{where}: {field.name} must be null on a CPU profile")
    if field.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, field.type):
        raise ProfileError(f"{where}: {field.name} must be of type {field.type.__name__}")
    if field.low is not None and not field.low <= value <= field.high:
        raise ProfileError(f"{where}: {field.name}={value} is outside {field.low}..{field.high}")
    return value


def profile_from_dict(data: Any, *, where: str = "profile") -> Profile:
    """Check one profile's data against the schema and return it; raise ProfileError if not."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a mapping")
    known = {field.name for field in SCHEMA}
    if unknown := sorted(set(data) - known):
        raise ProfileError(f"{where}: unknown keys {', '.join(unknown)}")
    if missing := sorted(known - set(data)):
        raise ProfileError(f"{where}: missing keys {', '.join(missing)} (write null for none)")
    kind = data["kind"]
    if kind not in KINDS:
        raise ProfileError(f"{where}: kind must be one of {', '.join(KINDS)}")
    values = {field.name: _checked(field, data[field.name], kind, where) for field in SCHEMA}
    if not SLUG.match(values["name"]):
        raise ProfileError(f"{where}: name must be a lowercase slug")
    if not all(isinstance(pattern, str) and pattern for pattern in values["nvml_names"]):
        raise ProfileError(f"{where}: nvml_names must be non-empty strings")
    if kind == "gpu":
        _check_gpu(values, where)
    elif values["nvml_names"]:
        raise ProfileError(f"{where}: a CPU profile matches no NVML names")
    values["nvml_names"] = tuple(values["nvml_names"])
    return Profile(**values)


def _check_gpu(values: dict[str, Any], where: str) -> None:
    if not values["nvml_names"]:
        raise ProfileError(f"{where}: a GPU profile needs at least one NVML name pattern")
    cc = values["compute_capability"]
    if not COMPUTE_CAPABILITY.match(cc):
        raise ProfileError(f"{where}: compute_capability must look like 9.0")
    architecture = ARCHITECTURES.get(values["architecture"])
    if architecture is None:
        raise ProfileError(f"{where}: architecture must be one of {', '.join(ARCHITECTURES)}")
    if cc not in architecture.compute_capabilities:
        raise ProfileError(f"{where}: compute capability {cc} is not {values['architecture']}")
    if values["tensor_core_generation"] != architecture.tensor_core_generation:
        raise ProfileError(f"{where}: tensor_core_generation does not match the architecture")
    has_fp8 = parse_compute_capability(cc) >= FP8_FROM
    if has_fp8 != (values["fp8_tflops"] is not None):
        raise ProfileError(f"{where}: fp8_tflops must be set exactly when cc >= 8.9")


def load_profile(path: Path) -> Profile:
    """Read and check one profile file; its name must match the file's."""
    with path.open() as stream:
        profile = profile_from_dict(yaml.safe_load(stream), where=path.name)
    if profile.name != path.stem:
        raise ProfileError(f"{path.name}: name {profile.name!r} differs from the file name")
    return profile


@functools.cache
def _load_dir(directory: Path) -> tuple[Profile, ...]:
    return tuple(load_profile(path) for path in sorted(directory.glob("*.yaml")))


def load_profiles(directory: Path = PROFILES_DIR) -> tuple[Profile, ...]:
    """Return every profile in the directory, checked; cached, as the files ship with the code."""
    return _load_dir(directory)


def profile_named(name: str, profiles: Iterable[Profile] | None = None) -> Profile | None:
    return next((p for p in profiles or load_profiles() if p.name == name), None)


@dataclass(frozen=True, slots=True)
class Match:
    """Which profile a GPU is, and why."""

    profile: Profile
    reason: str

    @property
    def generic(self) -> bool:
        return self.profile.generic


def _memory_fits(profile: Profile, memory_mb: int) -> bool:
    reported_gib = memory_mb / 1024
    low, high = MEMORY_MATCH_RANGE
    return low * profile.memory_gb <= reported_gib <= high * profile.memory_gb


def generic_profile(*, name: str, memory_mb: int, compute_capability: tuple[int, int]) -> Profile:
    """Build a profile from NVML's report alone, for a GPU no file describes."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.casefold()).strip("-") or "gpu"
    return Profile(
        name=f"generic-{slug}",
        display_name=f"{name} (no profile)",
        kind="gpu",
        architecture=None,
        compute_capability="{}.{}".format(*compute_capability),
        tensor_core_generation=None,
        memory_gb=round(memory_mb / 1024, 1),
        memory_bandwidth_gbps=None,
        sm_count=None,
        fp16_tflops=None,
        fp8_tflops=None,
        int8_tops=None,
        pcie_generation=None,
        pcie_lanes=None,
        nvlink_bandwidth_gbps=None,
        tdp_watts=None,
        hourly_price_usd=0.0,  # unknown: the operator prices it once it has a profile file
        nvml_names=(name,),
        datasheet="none: built from NVML",
        generic=True,
    )


def match_profile(
    *,
    name: str,
    memory_mb: int,
    compute_capability: tuple[int, int],
    profiles: Iterable[Profile] | None = None,
) -> Match:
    """Return the profile whose NVML name, memory size and compute capability all match.

    All three must agree, so that a renamed or cut-down part (an H100 NVL, a 16 GB V100, a MIG
    slice) is never priced and sized as its big sibling; anything else gets a generic profile
    built from what NVML reports, with a warning.
    """
    gpus = [p for p in profiles or load_profiles() if p.kind == "gpu"]
    named = [p for p in gpus if p.matches_name(name)]
    exact = [p for p in named if _memory_fits(p, memory_mb) and p.cc == tuple(compute_capability)]
    cc = "{}.{}".format(*compute_capability)
    if exact:
        profile = min(exact, key=lambda p: abs(p.memory_gb - memory_mb / 1024))
        return Match(profile, f"name, memory ({memory_mb} MiB) and compute capability {cc} match")
    if named:
        reason = "; ".join(
            f"name matches {p.name}, but it has {p.memory_gb:g} GB and cc {p.compute_capability}"
            for p in named
        )
    else:
        reason = "no profile's NVML names match"
    logger.warning(
        "GPU %r (%s MiB, cc %s) has no hardware profile (%s): using a generic one built from "
        "NVML; add a file to inference/hardware/profiles/",
        name,
        memory_mb,
        cc,
        reason,
    )
    return Match(
        generic_profile(name=name, memory_mb=memory_mb, compute_capability=compute_capability),
        reason,
    )


# A dense decoder's prefill needs about 2 FLOPs per parameter per token; engines reach roughly
# this share of the datasheet's dense FP16 rate on long prompts (vLLM on H100/A100/L4 measures
# 40-60%).
PREFILL_MFU = 0.5
# Decode reads every weight once per step; engines reach roughly this share of the datasheet
# bandwidth.
DECODE_BANDWIDTH_EFFICIENCY = 0.7
# Share of GPU memory vLLM takes (--gpu-memory-utilization's default).
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True, slots=True)
class ServingRates:
    """What a GPU of a profile serves for one dense model, from its datasheet figures."""

    prefill_tokens_per_second: float
    decode_steps_per_second: float  # a step decodes one token of every running sequence
    kv_cache_tokens: int  # tokens of KV cache left after the weights


def serving_rates(
    profile: Profile,
    *,
    params_billion: float,
    kv_bytes_per_token: int,
    bytes_per_param: float = 2.0,
    gpu_count: int = 1,
) -> ServingRates | None:
    """A profile's prefill and decode rates for a model, or None for the CPU profile."""
    if profile.fp16_tflops is None or profile.memory_bandwidth_gbps is None:
        return None
    weights = params_billion * 1e9 * bytes_per_param
    memory = (profile.memory_gb or 0.0) * 1e9 * GPU_MEMORY_UTILIZATION * gpu_count
    return ServingRates(
        prefill_tokens_per_second=profile.fp16_tflops * 1e12 * gpu_count * PREFILL_MFU
        / (2 * params_billion * 1e9),
        decode_steps_per_second=profile.memory_bandwidth_gbps * 1e9 * gpu_count
        * DECODE_BANDWIDTH_EFFICIENCY / weights,
        kv_cache_tokens=max(0, int((memory - weights) / kv_bytes_per_token)),
    )  # fmt: skip
