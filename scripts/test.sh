#!/usr/bin/env bash
# Run the whole test suite against real PostgreSQL, Redis and vLLM worker processes, starting
# the local servers when they are not running. Arguments go to pytest.
#   --fast  first: only the tests that start no platform processes or engines (-m "not e2e";
#           the marker follows from the fixtures a test uses, tests/conftest.py), on every core
#           (pytest-xdist, at most four workers: each has its own test database and Redis
#           database, dmxplatform/settings/test.py)
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
if [ "${1:-}" = "--fast" ]; then
  shift
  lane=(-m "not e2e" -n auto --maxprocesses 4)
fi

mkdir -p .run
# Setting up the virtualenvs and node_modules one run at a time.
flock .run/bootstrap.lock ./scripts/services.sh --postgres
flock .run/bootstrap.lock ./scripts/bootstrap.sh

# The import rules ([tool.importlinter] in pyproject.toml) before any test: under a second, and
# a run on code that breaks them fails.
.venv/bin/lint-imports --no-cache --no-logo

# The suite's own environment; the real environment and .env do not leak in. pytest's process
# loads dmxplatform.settings.test (pyproject.toml; a DJANGO_SETTINGS_MODULE from outside would
# win over it), the processes it starts dmxplatform.settings: what they must agree on (secrets,
# databases, cadences) is set here, for all of them.
unset DJANGO_SETTINGS_MODULE
export DMX_DEBUG=1
export DJANGO_SECRET_KEY=test-secret-key
export DMX_KEY_PEPPER=test-pepper
export DATABASE_URL=${DMX_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/dmx}
export REDIS_URL=${DMX_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
export DMX_REDIS_PREFIX=dmxtest
# Fast cadences so that liveness tests finish in seconds.
export DMX_HEARTBEAT_SECONDS=0.5
# Stale after 5 s: three vLLM engines on two cores can hold a heartbeat back for over 3 s.
export DMX_NODE_STALE_SECONDS=5
export DMX_NODE_STALE_CHECK_SECONDS=0.5
export DMX_USAGE_FLUSH_SECONDS=0.5
# Billing alerts every second, and webhooks to the tests' receivers on 127.0.0.1 (production
# refuses private addresses; tests/billing/test_notifications.py holds it to that).
export DMX_BILLING_ALERTS_SECONDS=1
export DMX_WEBHOOK_ALLOW_PRIVATE=1
export DMX_STATE_REFRESH_SECONDS=0.25
# A body that stops arriving is refused after 2 s rather than 20.
export DMX_BODY_READ_TIMEOUT_SECONDS=2
# Batch workers look for work twice a second, and take over a killed worker's batch after 3 s.
export DMX_BATCH_TICK_SECONDS=0.5
export DMX_BATCH_HOLD_SECONDS=3
# One run at a time per database and Redis database: the suite owns both, and a second run
# would drop them under the first. Runs given other ones (DMX_TEST_DATABASE_URL,
# DMX_TEST_REDIS_URL) go side by side.
run_id=$(printf '%s %s' "$DATABASE_URL" "$REDIS_URL" | md5sum | cut -c1-8)
exec 9>".run/test-$run_id.lock"
if ! flock -n 9; then
  echo "==> waiting for another test run on the same databases to finish" >&2
  flock 9
fi
# Spooled stream entries and the processes' logs of this run only.
export DMX_SPOOL_DIR=$PWD/.run/test-spool-$run_id
export DMX_FILES_ROOT=$PWD/.run/test-files-$run_id
export DMX_TEST_LOG_DIR=$PWD/.run/test-logs${DMX_TEST_DATABASE_URL:+-$run_id}
export HF_HUB_OFFLINE=1
export PYTHONDONTWRITEBYTECODE=1

# The request path's types ([tool.mypy] in pyproject.toml), checked before any test as the
# import rules are: about ten seconds, a few with its cache.
.venv/bin/mypy

# The documentation site, strictly (a broken link or anchor, a page missing from the nav, a
# setting read but not documented, an alert without its runbook fail it), into a scratch
# directory: a few seconds. Its references are generated from this checkout's code
# (docs/hooks/reference.py), hence python -m from the repository root.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet --site-dir "$site_dir"
rm -rf "$site_dir"

# The deploy tests render the Kubernetes manifests with kustomize (kubectl's own, Debian's
# kubernetes-client where the machine has none).
if ! command -v kubectl >/dev/null && ! command -v kustomize >/dev/null; then
  echo "==> installing kubectl (apt-get, to render the Kubernetes manifests)"
  apt-get install -y -qq kubernetes-client >/dev/null || { apt-get update -qq && apt-get install -y -qq kubernetes-client >/dev/null; }
fi
# The browser tests drive Debian's Chromium through Playwright (which cannot download a
# browser here); installed when missing.
if ! command -v chromium >/dev/null; then
  echo "==> installing chromium (apt-get, for the browser tests)"
  apt-get install -y -qq chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
fi
flock .run/bootstrap.lock .venv/bin/python manage.py collectstatic --noinput -v0

status=0
.venv/bin/python -m pytest "${lane[@]}" "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
