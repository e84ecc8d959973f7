#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tests (issue 18): installs the Debian package when the
# server binaries are missing (as root), makes a cluster in a temporary directory, starts it, and prints its
# URL. Runs the server as the `postgres` user when started as root (PostgreSQL refuses to run as root).
#
# Usage:   eval "$(bash scripts/postgres.sh start)"   # exports SATELLITE_TEST_POSTGRES_URL and PGTEST_DIR
#          bash scripts/postgres.sh stop "$PGTEST_DIR"
# Env:     PGTEST_PORT  the port (default: a free one)
set -euo pipefail

find_bin() {
  local found
  found=$(command -v "$1" 2>/dev/null || true)
  if [ -z "$found" ]; then
    found=$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -1 || true)
  fi
  echo "$found"
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
  start)
    if [ -z "$(find_bin initdb)" ] || [ -z "$(find_bin pg_ctl)" ]; then
      if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq postgresql >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
      else
        echo "error: PostgreSQL's server binaries are required (apt-get install postgresql)" >&2; exit 1
      fi
    fi
    initdb=$(find_bin initdb); pg_ctl=$(find_bin pg_ctl)
    port=${PGTEST_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
    dir=$(mktemp -d /tmp/satellite-pg.XXXXXX)
    chmod 755 "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    as_owner "$initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    # fsync off: a test database that a crash may lose; 300 connections: many test stores at once.
    as_owner "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
      start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    echo "export SATELLITE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$port/postgres"
    echo "export PGTEST_DIR=$dir"
    ;;
  stop)
    dir=${2:?the directory printed by start}
    as_owner "$(find_bin pg_ctl)" -D "$dir/data" -m fast stop >/dev/null || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start | stop DIR" >&2; exit 2
    ;;
esac
