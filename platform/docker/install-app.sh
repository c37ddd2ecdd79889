#!/usr/bin/env bash
# Strop's Python environment inside the API/worker image: the virtualenv at .venv (the path
# platform/Procfile names), torch first and pinned, then requirements.lock, as the Makefile does.
# Run from the source root, with requirements.lock, requirements-cuda.lock and sdk/ present.
#   install-app.sh cpu    torch from PyTorch's CPU index (the +cpu build of requirements.lock's pin)
#   install-app.sh cuda   torch and its CUDA libraries from PyPI, pinned by requirements-cuda.lock
# Env: TORCH_CPU_INDEX_URL (default https://download.pytorch.org/whl/cpu), PYTHON (default python3).
set -euo pipefail
variant=${1:?cpu or cuda}
venv=.venv
torch_pin=$(grep -E '^torch==' requirements.lock)
pip=("$venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --no-input)

"${PYTHON:-python3}" -m venv "$venv"
case "$variant" in
    cpu)
        "${pip[@]}" --index-url "${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}" "$torch_pin+cpu"
        ;;
    cuda)
        if ! grep -qxF "$torch_pin" requirements-cuda.lock; then
            echo "install-app: requirements-cuda.lock does not pin $torch_pin (requirements.lock's torch)" >&2
            exit 1
        fi
        "${pip[@]}" -r requirements-cuda.lock
        ;;
    *)
        echo "install-app: variant must be cpu or cuda, not '$variant'" >&2
        exit 2
        ;;
esac
# torch is already there at the locked version, so this never swaps it for another build.
"${pip[@]}" -r requirements.lock
"$venv/bin/python" - "${torch_pin#torch==}" <<'PY'
import sys

import torch

if torch.__version__.split("+")[0] != sys.argv[1]:
    raise SystemExit(f"install-app: torch {torch.__version__} installed, {sys.argv[1]} pinned")
print(f"install-app: torch {torch.__version__}")
PY
bash platform/docker/add-user.sh "$(pwd)"
