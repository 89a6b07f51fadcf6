from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import KUBERNETES, OVERLAYS, kustomize_command, render


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """Every overlay rendered, with its Secrets' env files taken from the *.example files."""
    if kustomize_command() is None:
        # The test command installs one (scripts/test.sh); never pass without rendering.
        pytest.fail("neither kustomize nor kubectl (kubectl kustomize) is on PATH")
    tree = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    for example in tree.glob("overlays/*/*.env.example"):
        shutil.copy(example, example.with_suffix(""))
    return {overlay: render(Path(tree, "overlays", overlay)) for overlay in OVERLAYS}
