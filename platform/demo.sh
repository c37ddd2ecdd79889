#!/usr/bin/env bash
# `make demo`: the API on the embedded default (SQLite under var/, filesystem Celery broker),
# a demo tenant with a fresh key, a short walk through ingestion, then the API keeps serving.
#   DEMO_PORT=8000   port to serve on (loopback only)
#   DEMO_EXIT=1      stop after the walk-through instead of serving (used by scripts)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PORT=${DEMO_PORT:-8000}
BASE="http://127.0.0.1:$PORT"
unset DATABASE_URL REDIS_URL CELERY_BROKER_URL  # the embedded default

echo "==> database (SQLite at var/strop.sqlite3)"
$PY manage.py migrate -v 0
$PY manage.py tenant_create "Demo" --slug demo --exists-ok >/dev/null
KEY=$($PY manage.py api_key_create demo --name "make demo")

echo "==> API on $BASE (gunicorn)"
.venv/bin/gunicorn config.wsgi -b "127.0.0.1:$PORT" -w 2 -k gthread --threads 4 --log-level warning &
API_PID=$!
trap 'kill $API_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do curl -sf "$BASE/health" >/dev/null && break; sleep 0.2; done
curl -sf "$BASE/health" >/dev/null || { echo "the API did not start" >&2; exit 1; }

call() {  # call METHOD PATH [JSON]
  echo "\$ curl -X $1 $BASE$2 ${3:+-d '$3'}"
  curl -s -X "$1" "$BASE$2" -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" ${3:+-d "$3"}
  echo; echo
}
RUN=$(date +%s)
echo "==> walk-through"
call POST /v1/interactions "{\"items\": [
  {\"client_id\": \"demo-$RUN-1\", \"prefix\": \"def add(a, b):\\n    \", \"suffix\": \"\\n\", \"completion\": \"return a + b\", \"end_user_id\": \"dev-1\", \"opted_in\": true},
  {\"client_id\": \"demo-$RUN-2\", \"prompt\": \"import os\\n\", \"completion\": \"\", \"end_user_id\": \"dev-2\"},
  {\"client_id\": \"demo-$RUN-3\", \"prompt\": 42, \"completion\": \"x\"}]}"
call POST /v1/feedback "{\"items\": [
  {\"client_id\": \"demo-$RUN-1\", \"outcome\": \"accepted\"},
  {\"client_id\": \"demo-$RUN-2\", \"outcome\": \"not_shown\"},
  {\"client_id\": \"demo-$RUN-9\", \"outcome\": \"rejected\"}]}"
call GET "/v1/interactions?limit=2"

cat <<MSG
==> Strop is serving on $BASE (embedded default: SQLite, filesystem Celery broker)
    API key for tenant 'demo' (shown once): $KEY
    API docs:  $BASE/api/docs/
    Try:       curl -H "Authorization: Bearer $KEY" $BASE/v1/tenant
MSG
if [ "${DEMO_EXIT:-0}" = "1" ]; then exit 0; fi
echo "    Ctrl-C to stop."
wait $API_PID
