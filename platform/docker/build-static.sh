#!/usr/bin/env bash
# The dashboard's static files, built ahead of time so nothing needs npm when Strop runs.
#   build-static.sh vendor OUT    htmx and axe-core (platform/vendor-assets.sh, at the Makefile's
#                                 versions) into OUT/vendor/static; needs npm, or a var/vendor that
#                                 `make assets` already filled (reused, nothing fetched)
#   build-static.sh collect OUT   Django's collectstatic into OUT/staticfiles, from OUT/vendor/static
#                                 and the apps; needs Strop's Python environment (PYTHON, default
#                                 python), no database, no network
#   build-static.sh all OUT       both
# With STROP_VAR_DIR=OUT and STROP_VENDOR_STATIC_DIR=OUT/vendor/static, the settings' STATIC_ROOT is
# OUT/staticfiles and WhiteNoise (config/settings.py) serves it, compressed copies included. The
# image builds it at /app/var. Nothing else is written to OUT: no secret, no database.
set -euo pipefail
step=${1:?vendor, collect or all}
out=${2:?output directory}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

make_var() {  # the value of NAME := VALUE in the Makefile, the one place the versions are pinned
    sed -n "s/^$1 := //p" "$root/Makefile"
}

vendor() {
    local htmx axe cached
    htmx=$(make_var HTMX_VERSION)
    axe=$(make_var AXE_VERSION)
    if [[ -z "$htmx" || -z "$axe" ]]; then
        echo "build-static: HTMX_VERSION or AXE_VERSION not found in the Makefile" >&2
        exit 1
    fi
    mkdir -p "$out/vendor"
    # What `make assets` unpacked already: vendor-assets.sh finds it and fetches nothing.
    for cached in "$root/var/vendor/htmx.org-$htmx" "$root/var/vendor/axe-core-$axe"; do
        if [[ -d "$cached/package" && ! -e "$out/vendor/$(basename "$cached")" ]]; then
            cp -R "$cached" "$out/vendor/"
        fi
    done
    (cd "$root" && STROP_VENDOR_DIR="$out/vendor" bash platform/vendor-assets.sh "$htmx" "$axe")
}

collect() {
    local scratch
    if [[ ! -f "$out/vendor/static/htmx.min.js" ]]; then
        echo "build-static: $out/vendor/static has no htmx.min.js; run the vendor step first" >&2
        exit 1
    fi
    # The settings write their working files (generated secrets, metrics, a broker folder) under
    # STROP_VAR_DIR: a scratch folder here, thrown away; only its staticfiles are kept. No DATABASE_URL
    # or REDIS_URL: collectstatic needs neither, and a deployment's settings would ask for secrets.
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' RETURN
    (
        cd "$root"
        env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL \
            DJANGO_SETTINGS_MODULE=config.settings \
            STROP_VAR_DIR="$scratch" \
            STROP_VENDOR_STATIC_DIR="$out/vendor/static" \
            PROMETHEUS_MULTIPROC_DIR="$scratch/prometheus" \
            "${PYTHON:-python}" manage.py collectstatic --noinput --verbosity 0
    )
    rm -rf "$out/staticfiles"
    mv "$scratch/staticfiles" "$out/staticfiles"
}

case "$step" in
    vendor) vendor ;;
    collect) collect ;;
    all) vendor && collect ;;
    *)
        echo "build-static: the step is vendor, collect or all, not '$step'" >&2
        exit 2
        ;;
esac
echo "build-static: $step done in $out"
