"""What ships runs: every management command in the platform's wheel loads from the wheel's
files alone, with no repository checkout beside it (the image installs the same file set:
deploy/docker/platform.Dockerfile copies what pyproject.toml packages)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT

# pip builds the wheel in an isolated environment (setuptools from the registry) and compiles
# the intent features' C extension: tens of seconds here.
BUILD_TIMEOUT_SECONDS = 600

LOAD_EVERY_COMMAND = """
import sys
from pathlib import Path

import django
from django.core.management import get_commands, load_command_class

django.setup()
site = Path(sys.argv[1]).resolve()
ours = {
    name: app
    for name, app in get_commands().items()
    if app.split(".")[0] in {"apps", "config", "dmxplatform"}
}
for name, app in sorted(ours.items()):
    command = load_command_class(app, name)
    source = Path(sys.modules[type(command).__module__].__file__).resolve()
    assert source.is_relative_to(site), f"{name} loaded from {source}, not the wheel"
    print(name, app)
"""


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(built), str(ROOT)],
        check=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        capture_output=True,
    )
    (wheel,) = built.glob("dmx_platform-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_holds_the_platform_and_not_the_checkouts_tools(wheel_site):
    packages = {path.name for path in wheel_site.iterdir() if (path / "__init__.py").exists()}
    assert packages == {"apps", "config", "dmxplatform", "inference"}
    assert list(wheel_site.glob("apps/gateway/intent/artifacts/*.npz"))


def test_every_management_command_in_the_wheel_loads_from_its_files(wheel_site, tmp_path):
    # Run from an empty directory with the wheel's files first on the path: the checkout's
    # packages (the editable install) are shadowed, and tools/ is nowhere to be found.
    env = {
        **os.environ,
        "PYTHONPATH": str(wheel_site),
        "DJANGO_SETTINGS_MODULE": "dmxplatform.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EVERY_COMMAND, str(wheel_site)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    loaded = dict(line.split() for line in done.stdout.splitlines())
    shipped = {
        path.stem
        for path in wheel_site.glob("*/**/management/commands/*.py")
        if path.stem != "__init__"
    }
    assert shipped and set(loaded) >= shipped
    assert loaded["dmx_demo"] == "config"
