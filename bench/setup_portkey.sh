#!/usr/bin/env bash
# The benchmark's second yardstick: Portkey's open-source AI gateway (npm @portkey-ai/gateway,
# Node), in a directory of its own (.run/bench/portkey), so that `bench/run.py --portkey`
# measures it beside the gateway. Benchmark only; the platform and its tests never use it.
# Its streamed chat completions fail on Node here ("TypeError: immutable" as it appends to the
# upstream response's headers; Portkey-AI/gateway issues 1389 and 1550, open), with
# @hono/node-server 1.14.2 as those issues suggest too, and in 1.9.8, the only other release
# the registry offers: the tables say so rather than show figures for failures.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.15.2
DIR=.run/bench/portkey
if [ "$(cat "$DIR/portkey-version" 2>/dev/null)" != "$VERSION" ]; then
  rm -rf "$DIR" && mkdir -p "$DIR"
  npm install --prefix "$DIR" --no-audit --no-fund --silent "@portkey-ai/gateway@$VERSION"
  echo "$VERSION" > "$DIR/portkey-version"
fi
