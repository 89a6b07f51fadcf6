#!/usr/bin/env bash
# Serve the documentation site (mkdocs.yml, docs/) at http://127.0.0.1:8001, rebuilt on every
# change. Arguments go to `mkdocs serve` (e.g. --dev-addr 0.0.0.0:8001).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .run
flock .run/bootstrap.lock ./scripts/bootstrap.sh
# The API and settings references are generated from the code (docs/hooks/reference.py): the
# checkout's own packages, not an installed copy.
export NO_MKDOCS_2_WARNING=1
exec .venv/bin/python -m mkdocs serve --dev-addr 127.0.0.1:8001 "$@"
