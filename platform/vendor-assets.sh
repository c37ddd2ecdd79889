#!/usr/bin/env bash
# Fetch the dashboard's front-end libraries from the npm registry at pinned versions and put
# the files Django serves under var/vendor/static/ (git ignores var/; nothing vendored is
# committed). Usage: vendor-assets.sh HTMX_VERSION AXE_VERSION. Idempotent.
set -euo pipefail
HTMX_VERSION=${1:?htmx version}
AXE_VERSION=${2:?axe-core version}
VENDOR=${STROP_VENDOR_DIR:-var/vendor}
STATIC="$VENDOR/static"
mkdir -p "$STATIC"

if ! command -v npm >/dev/null 2>&1; then
  echo "vendor-assets: npm is needed to fetch htmx and axe-core (apt-get install npm)" >&2
  exit 1
fi

unpack() {  # unpack <package> <version> <file inside the package> <target name>
  local package=$1 version=$2 inner=$3 target=$4
  local work="$VENDOR/$package-$version"
  if [ ! -f "$work/package/$inner" ]; then
    rm -rf "$work" && mkdir -p "$work"
    (cd "$work" && npm pack --silent --no-fund --no-audit "$package@$version" >/dev/null)
    tar -xzf "$work"/*.tgz -C "$work"
  fi
  cp "$work/package/$inner" "$STATIC/$target"
}

unpack htmx.org "$HTMX_VERSION" dist/htmx.min.js htmx.min.js
unpack axe-core "$AXE_VERSION" axe.min.js axe.min.js
echo "vendor-assets: htmx $HTMX_VERSION and axe-core $AXE_VERSION in $STATIC"
