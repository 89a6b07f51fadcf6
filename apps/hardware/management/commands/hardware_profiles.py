"""List the hardware profiles, load the profile files, or show which profile a GPU maps to.

manage.py hardware_profiles                      # the table
manage.py hardware_profiles --load               # files -> database, operators' prices kept
manage.py hardware_profiles --match "NVIDIA H100 80GB HBM3" --memory-mb 81559 --cc 9.0
"""

from __future__ import annotations

from argparse import ArgumentParser

from django.core.management.base import BaseCommand, CommandError

from apps.hardware.models import HardwareProfile
from apps.hardware.selectors import hardware_profile_find, hardware_profile_list
from apps.hardware.services import hardware_profiles_load
from inference.hardware.profiles import match_profile, parse_compute_capability

COLUMNS = (
    ("name", 22),
    ("memory GB", 9),
    ("GB/s", 6),
    ("SMs", 4),
    ("cc", 4),
    ("FP16 TF", 7),
    ("FP8 TF", 7),
    ("INT8 TOPS", 9),
    ("PCIe", 8),
    ("NVLink GB/s", 11),
    ("TDP W", 5),
    ("USD/h", 8),
)


def _number(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"


def _row(profile: HardwareProfile) -> tuple[str, ...]:
    pcie = f"Gen{profile.pcie_generation} x{profile.pcie_lanes}" if profile.pcie_generation else "-"
    price = f"{profile.hourly_price_usd:.2f}" + ("*" if profile.price_overridden else "")
    return (
        profile.name,
        _number(profile.memory_gb),
        _number(profile.memory_bandwidth_gbps),
        _number(profile.sm_count),
        profile.compute_capability or "-",
        _number(profile.fp16_tflops),
        _number(profile.fp8_tflops),
        _number(profile.int8_tops),
        pcie,
        _number(profile.nvlink_bandwidth_gbps),
        _number(profile.tdp_watts),
        price,
    )


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--load", action="store_true", help="load the profile files")
        parser.add_argument("--match", metavar="NVML_NAME", help="a GPU's name as NVML reports it")
        parser.add_argument("--memory-mb", type=int, help="its memory total, MiB (nvidia-smi's)")
        parser.add_argument("--cc", help="its compute capability, e.g. 9.0")

    def handle(self, *args, **options) -> None:
        if options["load"]:
            loaded = hardware_profiles_load()
            for label, names in (("created", loaded.created), ("updated", loaded.updated)):
                self.stdout.write(f"{label}: {', '.join(names) or 'none'}")
            self.stdout.write(f"unchanged: {len(loaded.unchanged)}")
        elif options["match"]:
            self._match(options["match"], options["memory_mb"], options["cc"])
        else:
            self._table()

    def _table(self) -> None:
        self.stdout.write("  ".join(title.ljust(width) for title, width in COLUMNS).rstrip())
        for profile in hardware_profile_list():
            cells = zip(_row(profile), COLUMNS, strict=True)
            self.stdout.write("  ".join(text.ljust(width) for text, (_, width) in cells).rstrip())
        self.stdout.write("* price set by an operator; dense TFLOPS and TOPS")

    def _match(self, name: str, memory_mb: int | None, cc: str | None) -> None:
        if memory_mb is None or cc is None:
            raise CommandError("--match needs --memory-mb and --cc: all three identify a GPU")
        try:
            capability = parse_compute_capability(cc)
        except ValueError as exc:
            raise CommandError(f"--cc {cc!r} is not a compute capability like 9.0") from exc
        match = match_profile(name=name, memory_mb=memory_mb, compute_capability=capability)
        profile = match.profile
        kind = "generic profile (no file describes it)" if match.generic else "profile"
        self.stdout.write(f"{name} ({memory_mb} MiB, cc {cc}) -> {kind} {profile.name}")
        self.stdout.write(f"  {profile.display_name}: {match.reason}")
        stored = hardware_profile_find(name=profile.name)
        if stored is not None:
            overridden = " (set by an operator)" if stored.price_overridden else ""
            self.stdout.write(f"  price: {stored.hourly_price_usd:.2f} USD/h{overridden}")
