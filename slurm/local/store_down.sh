#!/usr/bin/env bash
# Stops what store_up.sh started: the tracking server, then PostgreSQL (a fast shutdown: open
# transactions roll back, nothing committed is lost). The store's data stays: store_up.sh brings
# the same store back. HYPRUN_STORE_DIR as for store_up.sh.
set -euo pipefail
dir=${HYPRUN_STORE_DIR:-/var/lib/hyprun-store}
pid_file=$dir/mlflow.pid
if [[ -f $pid_file ]]; then
  pid=$(cat "$pid_file")
  # The server's workers are in its session (setsid): stop the whole group, then wait for it.
  if kill -TERM -- "-$pid" 2>/dev/null; then
    for _ in $(seq 150); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 -- "-$pid" 2>/dev/null; then
      echo "store_down.sh: the server ($pid) still runs after 30 s" >&2
      exit 1
    fi
  fi
  rm -f "$pid_file"
  echo "stopped the tracking server"
fi
if [[ -s $dir/pg/postmaster.pid ]]; then
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg" -m fast -w -t 60 stop >/dev/null
  echo "stopped PostgreSQL"
fi
