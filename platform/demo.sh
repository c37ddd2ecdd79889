#!/usr/bin/env bash
# `make demo`: the whole loop on the embedded default (SQLite under var/, filesystem Celery
# broker), on this machine, with nothing else installed:
#   vLLM (CPU build here) serves the small starter model; the API, a default/serving worker and
#   a gpu worker run beside it; a walk-through logs interactions and feedback with curl; then a
#   simulated developer uses completions, Strop trains the tenant's adapter on the feedback,
#   gates it, and the demo promotes it and measures acceptance again. The API keeps serving
#   until Ctrl-C.
#   DEMO_PORT=8000   API port (loopback only)      DEMO_EVENTS=128   events that start a run
#   DEMO_EXIT=1      stop at the end instead of serving
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PORT=${DEMO_PORT:-8000}
VLLM_PORT_DEMO=${DEMO_VLLM_PORT:-8100}
BASE="http://127.0.0.1:$PORT"
unset DATABASE_URL REDIS_URL CELERY_BROKER_URL  # the embedded default
export VLLM_BASE_URLS="http://127.0.0.1:$VLLM_PORT_DEMO"
# The processes it starts, each in a group of its own; all are stopped on exit, Ctrl-C included.
source platform/demo-processes.sh

echo "==> vLLM's environment and the small starter model (built once, then cached)"
bash platform/vllm-env.sh
MODEL=$($PY -m gpu_trainer starter --size small)
echo "    base model: $MODEL"
demo_start_vllm "$MODEL" "$VLLM_PORT_DEMO"

echo "==> database (SQLite at var/strop.sqlite3), tenant 'demo', adapter 'tab'"
$PY manage.py migrate -v 0
$PY manage.py tenant_create "Demo" --slug demo --exists-ok >/dev/null
KEY=$($PY manage.py api_key_create demo --name "make demo")
$PY manage.py base_model_register base "$MODEL" >/dev/null
$PY manage.py adapter_create demo tab --base base --default --exists-ok >/dev/null
# A dashboard sign-in for the demo tenant, with a fresh password at every run.
DASH_PASSWORD=$($PY -c "import secrets; print(secrets.token_urlsafe(12))")
$PY manage.py dashboard_user_create admin --tenant demo --role owner --password "$DASH_PASSWORD" >/dev/null

echo "==> API on $BASE, Celery workers (default+serving, gpu) on the filesystem broker"
rm -f "${PROMETHEUS_MULTIPROC_DIR:-${STROP_VAR_DIR:-var}/prometheus}"/*.db  # metrics start from zero with them
demo_start_api "$PORT"
demo_start_workers
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
$PY platform/demo_loop.py --base "$BASE" --key "$KEY" --events "${DEMO_EVENTS:-128}"

cat <<MSG

==> Strop is serving on $BASE (embedded default: SQLite, filesystem Celery broker; logs in var/log/)
    API key for tenant 'demo' (shown once): $KEY
    API docs:  $BASE/api/docs/
    Dashboard: $BASE/dashboard/  (user admin, password $DASH_PASSWORD)
    Try:       curl -H "Authorization: Bearer $KEY" $BASE/v1/adapters/tab/training-runs
MSG
if [ "${DEMO_EXIT:-0}" = "1" ]; then exit 0; fi
echo "    Ctrl-C to stop."
wait
