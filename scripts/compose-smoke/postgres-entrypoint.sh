#!/bin/bash
# The official image's docker-entrypoint.sh, as far as docker-compose.yml and
# docker-compose.pg-standby.yml use it: started as root, it hands the data directory to
# the postgres user and runs itself again as that user (gosu); on the first start of
# `postgres ...` it initialises the data directory from the official image's variables
# (UTF-8, or the migrations fail on bytes/str; the database; password logins from other
# containers; listening on every address, as the official postgresql.conf does, so that
# a standby copied from it does too); then it runs its arguments.
set -euo pipefail
if [[ $# == 0 || ${1:0:1} == - ]]; then
  set -- postgres "$@"
fi
if [[ $1 == postgres && $(id -u) == 0 ]]; then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec gosu postgres "${BASH_SOURCE[0]}" "$@"
fi
if [[ $1 == postgres && ! -s $PGDATA/PG_VERSION ]]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -A scram-sha-256 -E UTF8 \
    --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [[ $db != postgres ]]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "postgres stand-in: initialised $PGDATA (user $user, database $db)"
fi
exec "$@"
