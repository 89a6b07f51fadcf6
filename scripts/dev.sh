#!/usr/bin/env bash
# Set up everything and run the platform locally: the gateway, a Celery worker with beat, and
# vLLM workers registered as nodes. Ctrl-C stops them all.
#
# Settings come from the environment and .env (created on first run); see .env.example.
# Without DATABASE_URL the platform uses SQLite in db.sqlite3. Without DMX_WORKER_MODEL the
# worker serves the tiny offline model, built on first run into .cache/models/dmx-tiny, with
# tool calling (vLLM's hermes parser); a second worker serves the same weights as the code model
# dmx-tiny-code, which the routing table's alias `auto` sends code to (DMX_CODE_WORKER=0 leaves
# it out), and a third as the embedding model dmx-tiny-embed (DMX_EMBED_WORKER=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/bootstrap.sh

if [ ! -f .env ]; then
  echo "==> writing .env with fresh secrets (edit it to change settings)"
  {
    echo "DMX_DEBUG=1"
    echo "DJANGO_SECRET_KEY=$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(48))')"
    echo "DMX_KEY_PEPPER=$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))')"
  } > .env
fi
set -a; . ./.env; set +a
# Every engine started here (the workers below, and those Celery's local scaler starts with its
# environment) runs below the gateway's CPU priority: they share this machine's cores.
export DMX_ENGINE_NICE=${DMX_ENGINE_NICE:-10}

GATEWAY_HOST=${DMX_GATEWAY_HOST:-127.0.0.1}
GATEWAY_PORT=${DMX_GATEWAY_PORT:-8000}
WORKER_PORT=${DMX_WORKER_PORT:-8100}
MODEL_NAME=${DMX_WORKER_MODEL_NAME:-dmx-tiny}
EMBED_PORT=${DMX_EMBED_WORKER_PORT:-$((WORKER_PORT + 1))}
EMBED_MODEL_NAME=dmx-tiny-embed
CODE_PORT=${DMX_CODE_WORKER_PORT:-$((WORKER_PORT + 2))}
CODE_MODEL_NAME=dmx-tiny-code
mkdir -p .run

if [ -z "${REDIS_URL:-}" ]; then ./scripts/services.sh; fi

EMBED_WORKER=0
CODE_WORKER=0
TOOL_CALL_PARSER=""
if [ -z "${DMX_WORKER_MODEL:-}" ]; then
  EMBED_WORKER=${DMX_EMBED_WORKER:-1}
  CODE_WORKER=${DMX_CODE_WORKER:-1}
  TOOL_CALL_PARSER=hermes  # the tiny model's chat template speaks Hermes (inference/tiny_model.py)
  DMX_WORKER_MODEL=$PWD/.cache/models/dmx-tiny
  echo "==> the tiny offline model: $DMX_WORKER_MODEL"
  .venv-vllm/bin/python -m inference.tiny_model "$DMX_WORKER_MODEL" >/dev/null 2>&1
  export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
  # float32: see inference/tiny_model.py; compact JSON for structured outputs: see tests/stack.py
  compact_json='{"backend":"xgrammar","disable_any_whitespace":true}'
  DMX_WORKER_VLLM_ARGS=${DMX_WORKER_VLLM_ARGS:---enforce-eager --dtype float32 --structured-outputs-config $compact_json}
fi
CONTEXT=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]+'/config.json')).get('max_position_embeddings', 2048))" "$DMX_WORKER_MODEL" 2>/dev/null || echo 4096)

echo "==> migrating the database"
.venv/bin/python manage.py migrate --noinput >/dev/null
.venv/bin/python manage.py collectstatic --noinput >/dev/null

# With the code model, the routing table's alias `auto`: code to it, everything else (and what
# the classifier is unsure of) to $MODEL_NAME.
code_model=()
if [ "$CODE_WORKER" = 1 ]; then code_model=(--code-model-name "$CODE_MODEL_NAME"); fi
if [ "$EMBED_WORKER" = 1 ]; then code_model+=(--embed-model-name "$EMBED_MODEL_NAME"); fi
# Secrets are shown once; keep this run's so that a restart can print them again.
demo=$(.venv/bin/python manage.py dmx_demo --model-name "$MODEL_NAME" --source "$DMX_WORKER_MODEL" \
  --max-context-tokens "$CONTEXT" "${code_model[@]}")
.venv/bin/python - "$demo" <<'PY'
import json, pathlib, sys
new = json.loads(sys.argv[1])
path = pathlib.Path(".run/demo.json")
old = json.loads(path.read_text()) if path.exists() else {}
merged = {k: new.get(k) or old.get(k) for k in set(new) | set(old)}
path.write_text(json.dumps(merged))
path.chmod(0o600)
PY
# The demo models' engine settings (a version that has its own keeps them), and the embedding
# model a third worker serves.
generating=("$MODEL_NAME")
if [ "$CODE_WORKER" = 1 ]; then generating+=("$CODE_MODEL_NAME"); fi
for name in "${generating[@]}"; do
  .venv/bin/python manage.py model_ensure "$name" --source "$DMX_WORKER_MODEL" \
    --max-context-tokens "$CONTEXT" ${TOOL_CALL_PARSER:+--tool-call-parser "$TOOL_CALL_PARSER"} >/dev/null
done
if [ "$EMBED_WORKER" = 1 ]; then
  .venv/bin/python manage.py model_ensure "$EMBED_MODEL_NAME" --kind embed \
    --source "$DMX_WORKER_MODEL" --max-context-tokens "$CONTEXT" >/dev/null
fi
read_demo() { .venv/bin/python -c "import json; print(json.load(open('.run/demo.json')).get('$1') or '')"; }
API_KEY=$(read_demo api_key)
NODE_TOKEN=${DMX_NODE_TOKEN:-$(read_demo node_token)}
ADMIN_PASSWORD=$(read_demo operator_password)

pids=()
cleanup() {
  trap - EXIT INT TERM
  echo; echo "==> stopping"
  # Newest first: the worker drains and reports itself down while the gateway still listens.
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM
# Each child in a process group of its own: a terminal's Ctrl-C then reaches only this script,
# whose cleanup stops the worker while the gateway still takes its last heartbeat.
set -m

echo "==> starting the gateway on http://$GATEWAY_HOST:$GATEWAY_PORT"
.venv/bin/python -m config.serve --host "$GATEWAY_HOST" --port "$GATEWAY_PORT" \
  --workers "${DMX_GATEWAY_WORKERS:-1}" > .run/gateway.log 2>&1 &
pids+=($!)

echo "==> starting Celery (worker + beat)"
.venv/bin/celery -A config worker --beat --queues default,ledger,fleet --concurrency 1 \
  --without-gossip --without-mingle --without-heartbeat --loglevel INFO --schedule .run/celerybeat-schedule > .run/celery.log 2>&1 &
pids+=($!)

echo "==> starting a batch worker (/v1/batches)"
.venv/bin/celery -A config worker --queues batches --concurrency 1 --hostname batches@%h \
  --without-gossip --without-mingle --without-heartbeat --loglevel INFO > .run/batches.log 2>&1 &
pids+=($!)

echo "==> starting the vLLM worker for $MODEL_NAME on port $WORKER_PORT (logs: .run/worker.log)"
# The node token goes in the environment: a command line is visible to every user in `ps`.
DMX_NODE_TOKEN="$NODE_TOKEN" \
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto} \
.venv-vllm/bin/python -m inference.worker --model "$DMX_WORKER_MODEL" --name "$MODEL_NAME" \
  --port "$WORKER_PORT" --platform-url "http://127.0.0.1:$GATEWAY_PORT" \
  -- ${DMX_WORKER_VLLM_ARGS:---enforce-eager} > .run/worker.log 2>&1 &
pids+=($!)

served=("$MODEL_NAME")
EXTRA_LOGS=""
# A second worker of the same tiny weights (the code model, the embedding model): one OpenMP
# thread, unbound, a 1 GiB KV cache, so that it shares the cores with the first.
start_tiny_worker() {  # name port log what
  echo "==> starting the $4 for $1 on port $2 (logs: $3)"
  DMX_NODE_TOKEN="$NODE_TOKEN" \
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 \
  .venv-vllm/bin/python -m inference.worker --model "$DMX_WORKER_MODEL" --name "$1" \
    --port "$2" --platform-url "http://127.0.0.1:$GATEWAY_PORT" \
    -- ${DMX_WORKER_VLLM_ARGS:---enforce-eager} --max-num-seqs 16 > "$3" 2>&1 &
  pids+=($!)
  served+=("$1")
  EXTRA_LOGS+=" $3"
}
# The same weights under a second name, so that `auto` has two models to choose from.
if [ "$CODE_WORKER" = 1 ]; then
  start_tiny_worker "$CODE_MODEL_NAME" "$CODE_PORT" .run/worker-code.log worker
fi
# Run by vLLM as a pooling model (the platform tells the worker its kind).
if [ "$EMBED_WORKER" = 1 ]; then
  start_tiny_worker "$EMBED_MODEL_NAME" "$EMBED_PORT" .run/worker-embed.log "embedding worker"
fi

echo -n "==> waiting for the nodes to register"
for _ in $(seq 1 300); do
  models=$(curl -sf "http://127.0.0.1:$GATEWAY_PORT/v1/models" -H "Authorization: Bearer $API_KEY" || true)
  missing=0
  for name in "${served[@]}"; do
    grep -q "\"$name\"" <<<"$models" || missing=1
  done
  if [ "$missing" = 0 ]; then
    break
  fi
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo; echo "a process exited; see .run/*.log" >&2; exit 1; }
  done
  echo -n "."; sleep 1
done
echo

cat <<INFO

DMX platform is running.
  API (OpenAI-compatible)  http://$GATEWAY_HOST:$GATEWAY_PORT/v1
  developer portal         http://$GATEWAY_HOST:$GATEWAY_PORT/  (sign up; the mail to verify is in .run/gateway.log)
  management API           http://$GATEWAY_HOST:$GATEWAY_PORT/api/v1/  (docs: /api/docs/)
  admin                    http://$GATEWAY_HOST:$GATEWAY_PORT/admin/  (user admin${ADMIN_PASSWORD:+, password $ADMIN_PASSWORD})
  health, metrics          http://$GATEWAY_HOST:$GATEWAY_PORT/health  http://$GATEWAY_HOST:$GATEWAY_PORT/metrics
  demo API key             $API_KEY
  logs                     .run/gateway.log .run/celery.log .run/batches.log .run/worker.log$EXTRA_LOGS
  models                   ${served[*]}

Try:
  curl http://$GATEWAY_HOST:$GATEWAY_PORT/v1/chat/completions -H "Authorization: Bearer $API_KEY" \\
    -H "Content-Type: application/json" \\
    -d '{"model": "$MODEL_NAME", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}'
INFO
if [ "$CODE_WORKER" = 1 ]; then
  cat <<INFO
  # "auto": the routing table picks the model by the prompt's intent (code: $CODE_MODEL_NAME)
  curl http://$GATEWAY_HOST:$GATEWAY_PORT/v1/chat/completions -H "Authorization: Bearer $API_KEY" \\
    -H "Content-Type: application/json" \\
    -d '{"model": "auto", "messages": [{"role": "user", "content": "Write a Python function that reverses a list."}], "max_tokens": 16}'
INFO
fi
if [ "$EMBED_WORKER" = 1 ]; then
  cat <<INFO
  curl http://$GATEWAY_HOST:$GATEWAY_PORT/v1/embeddings -H "Authorization: Bearer $API_KEY" \\
    -H "Content-Type: application/json" -d '{"model": "$EMBED_MODEL_NAME", "input": ["Hello!", "Bye."]}'
INFO
fi
echo
echo "Ctrl-C stops everything."

wait -n "${pids[@]}"
echo "a process exited; see .run/*.log" >&2
exit 1
