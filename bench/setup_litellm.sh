#!/usr/bin/env bash
# The benchmark's yardstick: LiteLLM's proxy in a virtualenv of its own (.venv-litellm), so that
# `bench/run.py --litellm` measures it beside the gateway. Benchmark only; the platform and its
# tests never use it. 1.108.5 is the newest 1.108 release whose [proxy] extra resolves from PyPI
# here (1.108.10 and later pin litellm-enterprise / litellm-proxy-extras builds not published).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.108.5
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ "$(cat .venv-litellm/litellm-version 2>/dev/null)" != "$VERSION" ]; then
  "$PYTHON" -m venv .venv-litellm
  .venv-litellm/bin/pip install -qq "litellm[proxy]==$VERSION" 2>&1 |
    { grep -v "^WARNING: Location 'file://" || true; }
  echo "$VERSION" > .venv-litellm/litellm-version
fi
