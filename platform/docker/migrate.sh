#!/usr/bin/env bash
# One-shot, before any new API or worker starts (docs/deploy.md, "Upgrading"): the database
# migrations, then the base model vLLM serves registered under the name it serves it as, as
# platform/up.sh does. Idempotent: a second run changes nothing.
set -euo pipefail
python manage.py migrate --noinput
if [[ -n "${VLLM_MODEL:-}" ]]; then
    python manage.py base_model_register "${VLLM_SERVED_MODEL_NAME:-base}" "$VLLM_MODEL"
fi
