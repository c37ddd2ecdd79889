#!/usr/bin/env bash
# Both images, tagged by release (docs/deploy.md, "Images by release and rolling back"):
#   platform/docker/build-images.sh [cpu|cuda]          (default cpu)
# tags strop-app and strop-vllm VERSION-VARIANT (what compose runs: STROP_VERSION, default pyproject.toml's
# version) and VERSION-COMMIT-VARIANT (this exact commit, git's short hash; "-dirty" when tracked files
# have changes), e.g. strop-app:0.1.0-cpu and strop-app:0.1.0-1a2b3c4-cpu. The older tags stay, so
# going back is STROP_VERSION=<an older one> (docker image ls strop-app lists them).
# Env: DRY_RUN=1 prints the docker commands instead of running them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
variant=${1:-cpu}
case "$variant" in
    cpu | cuda) ;;
    *)
        echo "usage: platform/docker/build-images.sh [cpu|cuda]" >&2
        exit 2
        ;;
esac
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' pyproject.toml | head -n 1)
if [[ -z "$version" ]]; then
    echo "build-images.sh: no version = \"...\" line in pyproject.toml" >&2
    exit 2
fi
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- || commit="$commit-dirty"

run() {
    if [[ -n "${DRY_RUN:-}" ]]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}

run docker build -f platform/docker/app.Dockerfile --build-arg "TORCH_VARIANT=$variant" \
    -t "strop-app:$version-$variant" -t "strop-app:$version-$commit-$variant" .
run docker build -f platform/docker/vllm.Dockerfile --build-arg "VLLM_VARIANT=$variant" \
    -t "strop-vllm:$version-$variant" -t "strop-vllm:$version-$commit-$variant" .
echo "build-images.sh: strop-app and strop-vllm $version-$variant and $version-$commit-$variant;" \
    "compose runs STROP_VERSION=$version (or $version-$commit for this commit)" >&2
