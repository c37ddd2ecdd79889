# Sourced by platform/demo.sh (from the repository root): the processes the demo starts, and
# stopping every one of them however the demo ends (Ctrl-C, TERM, an error, the end).
#
# Each process runs in a session, so a process group, of its own: Ctrl-C in the terminal reaches
# the demo script only, which stops them all. SIGTERM goes to every group, then the script waits
# a bounded time (a Celery worker's warm shutdown waits for its running task, a training run can
# take minutes), then SIGKILL goes to whatever is left. Acks-late tasks killed so are delivered
# again at the next start.
#   DEMO_STOP_GRACE_S=10   seconds between SIGTERM and SIGKILL
#   DEMO_LOG_DIR=var/log   where each process writes its log

DEMO_LOG_DIR=${DEMO_LOG_DIR:-var/log}
DEMO_PIDS=()
mkdir -p "$DEMO_LOG_DIR"

demo_spawn() {  # demo_spawn NAME COMMAND...: COMMAND in a new session, its output in $DEMO_LOG_DIR/NAME.log
  local name=$1
  shift
  setsid "$@" > "$DEMO_LOG_DIR/$name.log" 2>&1 &
  DEMO_PIDS+=($!)  # setsid execs (a background job is no group leader): the pid is the group's id
}

demo_start_vllm() {  # demo_start_vllm MODEL_DIR PORT [SERVED_NAME]: the base model's name in Strop
  demo_spawn vllm env VLLM_PORT="$2" VLLM_SERVED_MODEL_NAME="${3:-base}" VLLM_KV_CACHE_BYTES=512M VLLM_MAX_MODEL_LEN=2048 \
    bash platform/vllm.sh "$1"
}

demo_start_api() {  # demo_start_api PORT
  demo_spawn api .venv/bin/gunicorn -c platform/gunicorn.conf.py config.asgi -b "127.0.0.1:$1" -w 2 \
    -k config.uvicorn_worker.StropUvicornWorker --log-level warning
}

demo_start_workers() {  # default + serving queues, webhooks (prefork: its time limits hold), and the gpu queue
  demo_spawn worker-default .venv/bin/celery -A config worker -Q default,serving --pool threads -c 4 \
    -n demo-default@%h -l info
  demo_spawn worker-webhooks .venv/bin/celery -A config worker -Q webhooks --pool prefork -c 2 \
    -n demo-webhooks@%h -l info
  demo_spawn worker-gpu .venv/bin/celery -A config worker -Q gpu --pool prefork -c 1 -n demo-gpu@%h -l info
}

demo_start_beat() {  # the periodic checks: a policy's max_wait_s, stale runs, resends (one beat: a lock)
  demo_spawn beat .venv/bin/celery -A config beat -s "${STROP_VAR_DIR:-var}/celerybeat-schedule" -l info
}

_demo_any_alive() {
  local pid
  for pid in "${DEMO_PIDS[@]}"; do
    kill -0 -- "-$pid" 2>/dev/null && return 0
  done
  return 1
}

demo_stop_all() {
  trap - EXIT INT TERM
  local pid deadline=$((SECONDS + ${DEMO_STOP_GRACE_S:-10}))
  [ ${#DEMO_PIDS[@]} -gt 0 ] || return 0
  for pid in "${DEMO_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  while _demo_any_alive && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  if _demo_any_alive; then
    echo "==> stopping what did not stop within ${DEMO_STOP_GRACE_S:-10} s (SIGKILL)" >&2
    for pid in "${DEMO_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + 5))  # gone before the script returns: the ports are free for the next start
    while _demo_any_alive && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  fi
}

trap demo_stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
