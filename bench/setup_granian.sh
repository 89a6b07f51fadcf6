#!/usr/bin/env bash
# Granian, the ASGI server `bench/run.py --granian` measures the gateway under beside uvicorn,
# into a directory of its own (.run/bench/granian) put on that one gateway's path: benchmark
# only, the platform and its tests never use it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.8.9
if [ ! -d ".run/bench/granian/granian-$VERSION.dist-info" ]; then
  rm -rf .run/bench/granian
  .venv/bin/pip install -qq --no-deps --target .run/bench/granian "granian==$VERSION" 2>&1 |
    { grep -v "^WARNING: Location 'file://" || true; }
fi
