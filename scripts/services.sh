#!/usr/bin/env bash
# Make sure Redis (and, with --postgres, PostgreSQL) answer on this machine; start the local
# servers when they don't. Used by the dev and test commands; changes nothing that runs.
set -euo pipefail
want_postgres=0
[ "${1:-}" = "--postgres" ] && want_postgres=1

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! port_open 6379; then
  if command -v redis-server >/dev/null; then
    # Append-only, as production must be: the usage streams survive a restart of it.
    echo "==> starting redis-server on 127.0.0.1:6379 (append-only, data in .run/redis)"
    mkdir -p .run/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly yes \
      --appendfsync everysec --dir "$PWD/.run/redis" --logfile "$PWD/.run/redis/redis.log"
    for _ in $(seq 1 50); do port_open 6379 && break; sleep 0.1; done
  else
    echo "Redis does not answer on 127.0.0.1:6379 and redis-server is not installed." >&2
    echo "Install it (apt-get install redis-server) or set REDIS_URL to a running server." >&2
    exit 1
  fi
fi

if [ "$want_postgres" = 1 ] && ! port_open 5432; then
  if command -v pg_ctlcluster >/dev/null; then
    echo "==> starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 1 100); do port_open 5432 && break; sleep 0.1; done
  else
    echo "PostgreSQL does not answer on 127.0.0.1:5432 and no local cluster is installed." >&2
    exit 1
  fi
fi
