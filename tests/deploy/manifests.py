"""Render the kustomize overlays of deploy/kubernetes and build what is derived from deploy/.

    python -m tests.deploy.manifests > deploy/kubernetes/base/prometheusrule.yaml

writes the PrometheusRule from deploy/prometheus/rules (tests/deploy check that it is current).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
RULE_FILES = ("recording.yml", "alerts.yml")
# Rendering an overlay reads a few files; a minute is far past any honest run.
RENDER_TIMEOUT_SECONDS = 60

RULE_HEADER = """\
# Built from deploy/prometheus/rules ({files}) by
#   python -m tests.deploy.manifests > deploy/kubernetes/base/prometheusrule.yaml
# Edit those files, not this one: tests/deploy fail while the two differ.
"""


def kustomize_command() -> list[str] | None:
    """Return the command that renders a kustomization: kustomize itself, or kubectl's."""
    if binary := shutil.which("kustomize"):
        return [binary, "build"]
    if binary := shutil.which("kubectl"):
        return [binary, "kustomize"]
    return None


def render(directory: Path) -> list[dict[str, Any]]:
    """Return the manifests a kustomization renders to, by kustomize's own rules."""
    command = kustomize_command()
    if command is None:
        raise RuntimeError("neither kustomize nor kubectl is on PATH")
    output = subprocess.run(
        [*command, str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_SECONDS,
    ).stdout
    return [document for document in yaml.safe_load_all(output) if document]


def prometheus_rule_groups() -> list[dict[str, Any]]:
    """Return the rule groups of deploy/prometheus/rules, recording rules first."""
    groups: list[dict[str, Any]] = []
    for name in RULE_FILES:
        text = (ROOT / "deploy" / "prometheus" / "rules" / name).read_text()
        groups.extend(yaml.safe_load(text)["groups"])
    return groups


def prometheus_rule() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "dmx",
            # kube-prometheus-stack's default ruleSelector picks rules by this label.
            "labels": {"release": "prometheus"},
        },
        "spec": {"groups": prometheus_rule_groups()},
    }


class _BlockDumper(yaml.SafeDumper):
    """Write multi-line strings (PromQL) as literal blocks, as the rule files have them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def main() -> None:
    sys.stdout.write(RULE_HEADER.format(files=", ".join(RULE_FILES)))
    yaml.dump(
        prometheus_rule(),
        sys.stdout,
        Dumper=_BlockDumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )


if __name__ == "__main__":
    main()
