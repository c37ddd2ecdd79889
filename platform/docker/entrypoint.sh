#!/usr/bin/env bash
# Both images' entry point. The command names what this container runs:
#   api | worker | worker-serving | worker-webhooks | worker-gpu | beat | vllm | ...
#                   a process of platform/Procfile, run by its line there, exactly as `make up` runs
#                   it: the Procfile stays the one definition of Strop's processes. Extra arguments
#                   are appended to its command line.
#   migrate         one-shot: the database migrations, then the base model registered (migrate.sh)
#   base-model      one-shot: the small starter model built into /models if VLLM_MODEL is its place
#   store-init      one-shot: the adapter store's bucket created, with versioning (create-bucket.py)
#   manage ARGS     python manage.py ARGS (e.g. manage tenant_create "Acme Corp" --slug acme)
#   anything else   run as given (e.g. bash)
# Env: STROP_PROCFILE (default platform/Procfile).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
procfile=${STROP_PROCFILE:-platform/Procfile}
what=${1:-api}

line=""
if [[ "$what" =~ ^[a-z][a-z0-9-]*$ ]]; then
    line=$(grep -E "^$what:" "$procfile" || true)
fi
if [[ -n "$line" ]]; then
    [[ $# -gt 0 ]] && shift
    # The only process in this container: the metrics files of an earlier start are stale (platform/up.sh
    # empties the folder the same way before starting every process of a host).
    rm -f "${PROMETHEUS_MULTIPROC_DIR:-${STROP_VAR_DIR:-var}/prometheus}"/*.db
    # As honcho does: the line through a shell (its ${VAR:-default}s expand here), exec'd so the
    # process receives the container's signals itself.
    exec bash -c "exec ${line#*:} \"\$@\"" "$what" "$@"
fi

case "$what" in
    migrate) shift && exec bash platform/docker/migrate.sh "$@" ;;
    base-model) shift && exec bash platform/docker/base-model.sh "$@" ;;
    store-init) shift && exec python platform/docker/create-bucket.py "$@" ;;
    manage) shift && exec python manage.py "$@" ;;
    *) exec "$@" ;;
esac
