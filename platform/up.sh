#!/usr/bin/env bash
# `make up`: every Strop process for local use, in one terminal (Ctrl-C stops them all).
# Postgres + Redis when DATABASE_URL / REDIS_URL are set, else the embedded default.
#   VLLM_MODEL=DIR   base model to serve (default: the small starter model, built once)
#   BASE_MODEL_NAME  the name vLLM serves it under and Strop registers (default: base)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
bash platform/vllm-env.sh
export VLLM_MODEL=${VLLM_MODEL:-$($PY -m gpu_trainer starter --size small)}
export VLLM_SERVED_MODEL_NAME=${BASE_MODEL_NAME:-base}
export VLLM_PORT=${VLLM_PORT:-8100}
export VLLM_BASE_URLS=${VLLM_BASE_URLS:-http://127.0.0.1:$VLLM_PORT}
$PY manage.py migrate -v 0
$PY manage.py base_model_register "$VLLM_SERVED_MODEL_NAME" "$VLLM_MODEL"
# Every process starts now and no old one still writes counters: start the metrics from zero.
rm -f "${PROMETHEUS_MULTIPROC_DIR:-${STROP_VAR_DIR:-var}/prometheus}"/*.db
exec .venv/bin/honcho -f platform/Procfile -d . start
