#!/usr/bin/env bash
# Two Slurm compute nodes on this one machine: a second cluster, "twonode", beside up.sh's
# single node. Each node is a slurmd in its own network and UTS namespace (its own hostname and
# address on a bridge), so ranks meet over TCP as on two machines; the filesystem is shared, as
# a cluster's /home is. Idempotent: rerunning it when the cluster is up takes a second or two.
#   sudo slurm/local/up_two_nodes.sh                      # starts up.sh's cluster too
#   export SLURM_CONF=/etc/slurm-twonode/slurm.conf       # then sinfo, sbatch, srun -N2 ... here
#   slurm/local/down.sh                                   # stops both clusters
# Inside a node, /etc/slurm and /etc/hosts are this cluster's (bound in the node's own mount
# namespace): a job's own srun and scontrol need no SLURM_CONF, and node names resolve.
set -euo pipefail
start=$SECONDS
here=$(cd "$(dirname "$0")" && pwd)
"$here/up.sh" >/dev/null # munge, MariaDB and slurmdbd, which both clusters share

cluster=twonode
conf_dir=/etc/slurm-$cluster
conf=$conf_dir/slurm.conf
host=$(hostname -s)
log=/var/log/slurm
bridge=hyprun-br
subnet=10.77.0        # the controller is .1, node i is .1i
ctld_addr=$subnet.1
ctld_port=6827        # up.sh's slurmctld has the default 6817 on this host
nodes=(node1 node2)
die() { echo "up_two_nodes.sh: $*" >&2; exit 1; }

# --- network: a bridge on this host, one veth into each node's namespace --------------------------
if ! command -v ip >/dev/null; then
  apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge ||
    die "cannot add a network bridge: this needs root with CAP_NET_ADMIN (a container: --privileged)"
fi
ip -br addr show dev "$bridge" | grep -q "$ctld_addr/" || ip addr add "$ctld_addr/24" dev "$bridge"
ip link set "$bridge" up
hosts="127.0.0.1 localhost
$ctld_addr $host"
for i in "${!nodes[@]}"; do hosts+=$'\n'"$subnet.1$((i + 1)) ${nodes[i]}"; done
for i in "${!nodes[@]}"; do
  ns=hyprun-${nodes[i]} veth=hyprun-v$((i + 1))
  [[ -e /run/netns/$ns ]] || ip netns add "$ns"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$bridge" up
    ip netns exec "$ns" ip addr add "$subnet.1$((i + 1))/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
  fi
done

# --- configuration: up.sh's, changed only where a second cluster must differ ----------------------
mkdir -p "$conf_dir" "/var/spool/slurmctld-$cluster"
for node in "${nodes[@]}"; do mkdir -p "/var/spool/slurmd-$node"; done
printf '%s\n' "$hosts" >"$conf_dir/hosts"
# slurmd drains a node configured with more memory than it detects: take its own figure.
mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
cpus=${HYPRUN_SLURM_CPUS:-$(nproc)}
declare -A own=(
  [ClusterName]=$cluster
  [SlurmctldHost]="$host($ctld_addr)"
  [SlurmctldPort]=$ctld_port
  [StateSaveLocation]=/var/spool/slurmctld-$cluster
  [SlurmctldPidFile]=/run/slurmctld-$cluster.pid
  [SlurmctldLogFile]=$log/slurmctld-$cluster.log
  # %n: each node's own name, so two slurmd on one filesystem keep apart.
  [SlurmdSpoolDir]=/var/spool/slurmd-%n
  [SlurmdPidFile]=/run/slurmd-%n.pid
  [SlurmdLogFile]=$log/slurmd-%n.log
  [AccountingStorageHost]=$ctld_addr # slurmdbd, reached from inside the nodes too
  [SlurmdParameters]=config_overrides # both nodes may advertise the machine's CPUs or more
)
new=$(
  grep -v -E "^($(IFS='|'; echo "${!own[*]}")|NodeName|PartitionName)=" /etc/slurm/slurm.conf
  for key in "${!own[@]}"; do echo "$key=${own[$key]}"; done | sort
  for i in "${!nodes[@]}"; do
    echo "NodeName=${nodes[i]} NodeAddr=$subnet.1$((i + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
)
changed=0
if [[ ! -f $conf || $(cat "$conf") != "$new" ]]; then
  printf '%s\n' "$new" >"$conf"
  changed=1
fi
export SLURM_CONF=$conf

# --- daemons --------------------------------------------------------------------------------------
pidfiles=("/run/slurmctld-$cluster.pid")
for node in "${nodes[@]}"; do pidfiles+=("/run/slurmd-$node.pid"); done
alive() { local p; p=$(cat "$1" 2>/dev/null) && kill -0 "$p" 2>/dev/null; }
if ((changed)); then # a changed config needs fresh daemons (running jobs survive this)
  for f in "${pidfiles[@]}"; do alive "$f" && kill "$(cat "$f")"; done
  for f in "${pidfiles[@]}"; do while alive "$f"; do sleep 0.2; done; done
fi
# slurmctld only records accounting for a cluster that slurmdbd knows.
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$cluster"; then
  sacctmgr -i add cluster "$cluster" >/dev/null
fi
alive "/run/slurmctld-$cluster.pid" || slurmctld
# nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs the host's /sys/fs/cgroup.
in_node="hostname \$0 && mount --bind $conf_dir/hosts /etc/hosts && mount --bind $conf_dir /etc/slurm"
for node in "${nodes[@]}"; do
  alive "/run/slurmd-$node.pid" || nsenter --net="/run/netns/hyprun-$node" \
    unshare --uts --mount sh -c "$in_node && exec slurmd -N \$0" "$node"
done

ready() {
  [[ $(sinfo -h -N -o %t | sort -u | tr '\n' ' ') =~ ^((idle|mix|alloc)\ )+$ ]] &&
    (($(sinfo -h -N -o %N | wc -l) == ${#nodes[@]})) && sacct -n -X >/dev/null
}
for _ in $(seq 120); do ready 2>/dev/null && break; sleep 0.5; done
ready 2>/dev/null || die "nodes unusable after 60 s: $(sinfo -h -N -o '%N %t %E' 2>&1), see $log"
echo "slurm up: cluster $cluster, nodes ${nodes[*]} ($subnet.11-1${#nodes[@]}), $cpus cpus each," \
  "SLURM_CONF=$conf (took $((SECONDS - start))s)"
