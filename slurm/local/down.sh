#!/usr/bin/env bash
# Stops the daemons that up.sh and up_two_nodes.sh started, clients first, each by its pid file;
# waits for each. Job and accounting state survive: up.sh brings the same cluster back.
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
# up_two_nodes.sh's cluster first (it shares slurmdbd), then its nodes' namespaces and bridge.
for pidfile in /run/slurmd-node*.pid; do stop "$(basename "$pidfile" .pid)" "$pidfile"; done
stop slurmctld-twonode /run/slurmctld-twonode.pid
for ns in /run/netns/hyprun-node*; do [[ -e $ns ]] && ip netns del "$(basename "$ns")"; done
if ip link show hyprun-br >/dev/null 2>&1; then ip link del hyprun-br; fi
stop slurmd /run/slurmd.pid
stop slurmctld /run/slurmctld.pid
# slurmdbd before its database, so it can flush pending records.
stop slurmdbd /run/slurmdbd.pid
stop mariadbd /run/mysqld/mysqld.pid
stop munged /run/munge/munged.pid
