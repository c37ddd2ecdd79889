#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the dashboard's browser tests, and nginx for the
# TLS proxy example's (tests/deploy/test_proxy.py runs it). Idempotent and quick when they are
# there already. Playwright's own browser download cannot run here, so the
# tests launch /usr/bin/chromium (see tests/dashboard/browser/conftest.py).
set -euo pipefail
CHROMIUM=${STROP_CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ] && command -v chromedriver >/dev/null 2>&1 && command -v nginx >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-browser: $CHROMIUM is missing and there is no apt-get to install it" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "ensure-browser: installing chromium, chromium-driver and nginx-light (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale or absent on a fresh machine: refresh once, then install.
$SUDO apt-get install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core nginx-light >/dev/null 2>&1 || {
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core nginx-light >/dev/null
}
"$CHROMIUM" --version
