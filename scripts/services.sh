#!/usr/bin/env bash
# Make sure Postgres (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer; start them if they do not.
set -euo pipefail
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }
wait_for() { for _ in $(seq 1 30); do "$1" && return 0; sleep 1; done; return 1; }

if ! pg_up; then
  echo "==> starting PostgreSQL" >&2
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] || { echo "services: no PostgreSQL installation found in /etc/postgresql" >&2; exit 1; }
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  wait_for pg_up || { echo "services: PostgreSQL did not come up on 127.0.0.1:5432" >&2; exit 1; }
fi
if ! redis_up; then
  echo "==> starting Redis" >&2
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for redis_up || { echo "services: Redis did not come up on 127.0.0.1:6379" >&2; exit 1; }
fi
echo "==> PostgreSQL and Redis are answering" >&2
