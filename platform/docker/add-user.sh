#!/usr/bin/env bash
# The unprivileged user both images run as (uid/gid 10001, the same in each, so a named volume that
# one writes, such as the base models', the other reads), and the folders it owns: STROP_VAR_DIR
# (the settings' working files: metrics, caches, training runs) and /models (base models' mount).
#   add-user.sh APP_ROOT
set -euo pipefail
app_root=${1:?usage: add-user.sh APP_ROOT}
uid=${STROP_UID:-10001}

groupadd --system --gid "$uid" strop
useradd --system --uid "$uid" --gid strop --create-home --home-dir /home/strop --shell /usr/sbin/nologin strop
install -d -o strop -g strop -m 0750 "$app_root/var" /models
