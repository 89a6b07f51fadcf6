"""Skip the tests marked `gpu` where NVML finds no GPU (no library, no driver, no device)."""

from __future__ import annotations

import pytest

from inference.hardware.nvml import open_backend


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest hands every conftest's hook the whole session's items, so this covers gpu-marked
    # tests anywhere in a run that collects this directory.
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    backend = open_backend()
    if backend is not None:
        backend.close()
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: NVML finds none here")
    for item in marked:
        item.add_marker(skip)
