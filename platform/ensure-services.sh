#!/usr/bin/env bash
# Make sure Postgres and Redis answer on loopback, starting them where they are installed but
# stopped, and that the `strop` database exists. Idempotent; prints what it did.
set -euo pipefail
PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-postgres}
REDIS_PORT=${REDIS_PORT:-6379}
DB_NAME=${STROP_DB_NAME:-strop}

wait_for() {  # wait_for <what> <command...>
  local what=$1; shift
  for _ in $(seq 1 30); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "ensure-services: $what did not come up" >&2; return 1
}

if ! pg_isready -h "$PGHOST" -p "$PGPORT" >/dev/null 2>&1; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "ensure-services: starting PostgreSQL"
    for version in $(ls /etc/postgresql); do
      pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    done
  else
    echo "ensure-services: PostgreSQL is not answering on $PGHOST:$PGPORT and is not installed here" >&2
    exit 1
  fi
  wait_for PostgreSQL pg_isready -h "$PGHOST" -p "$PGPORT"
fi

if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "ensure-services: starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/strop.log
  else
    echo "ensure-services: Redis is not answering on 127.0.0.1:$REDIS_PORT and is not installed here" >&2
    exit 1
  fi
  wait_for Redis redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping
fi

if ! psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" | grep -q 1; then
  echo "ensure-services: creating database $DB_NAME"
  psql -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d postgres -qc "CREATE DATABASE \"$DB_NAME\""
fi
echo "ensure-services: PostgreSQL and Redis answer"
