#!/usr/bin/env bash
# Stops the daemons that up.sh started, clients first, each by its pid file; waits for each.
# Job and accounting state survive: up.sh brings the same cluster back.
set -euo pipefail
stop() { # name, pid file
  [[ -f $2 ]] || return 0
  local pid; pid=$(cat "$2")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "down.sh: $1 ($pid) still running after 30 s" >&2
      return 1
    fi
  fi
  rm -f "$2"
  echo "stopped $1"
}
stop slurmd /run/slurmd.pid
stop slurmctld /run/slurmctld.pid
# slurmdbd before its database, so it can flush pending records.
stop slurmdbd /run/slurmdbd.pid
stop mariadbd /run/mysqld/mysqld.pid
stop munged /run/munge/munged.pid
