#!/usr/bin/env bash
# A real single-node Slurm cluster (slurmctld + slurmd + slurmdbd on MariaDB) started by hand,
# for machines without systemd. Idempotent: rerunning it when the cluster is up takes a second.
#   sudo slurm/local/up.sh      # HYPRUN_SLURM_CPUS=8 to advertise more CPUs than the machine has
#   slurm/local/down.sh         # stops the daemons
set -euo pipefail
start=$SECONDS
host=$(hostname -s)
cluster=local
log=/var/log/slurm
die() { echo "up.sh: $*" >&2; exit 1; }
retry() { for _ in $(seq 60); do "$@" >/dev/null 2>&1 && return; sleep 0.5; done; return 1; }

# --- packages ------------------------------------------------------------------------------------
pkgs=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-cache show slurmctld >/dev/null 2>&1 || apt-get update -qq
  # Postinst scripts would start the services through init scripts: we start them ourselves.
  own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if ((own_policy)); then rm -f /usr/sbin/policy-rc.d; fi
fi
mkdir -p "$log" /var/spool/slurmctld /var/spool/slurmd /etc/slurm

# --- munge ---------------------------------------------------------------------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
  mungekey --create --force --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged
fi

# --- MariaDB (slurmdbd's store) ------------------------------------------------------------------
if ! mariadb-admin ping >/dev/null 2>&1; then
  [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >/dev/null
  install -d -o mysql -g mysql /run/mysqld
  setsid mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
    </dev/null >>"$log/mariadb.log" 2>&1 &
  retry mariadb-admin ping || die "mariadbd did not start, see $log/mariadb.log"
fi
# Keep the password of an earlier run so a running slurmdbd keeps working.
pass=$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf 2>/dev/null || true)
[[ -n $pass ]] || pass=$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
  ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

# --- configuration -------------------------------------------------------------------------------
changed=0
write() { # write stdin to $1 only when it differs, so a rerun leaves running daemons alone
  local new; new=$(cat)
  [[ -f $1 && $(cat "$1") == "$new" ]] && return
  printf '%s\n' "$new" >"$1"; changed=1
}
umask 077
write /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$log/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
umask 022
chmod 600 /etc/slurm/slurmdbd.conf

real_cpus=$(nproc)
cpus=${HYPRUN_SLURM_CPUS:-$real_cpus}
# slurmd drains a node configured with more memory than it detects: take its own figure.
mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
[[ -n $mem ]] || mem=$(free -m | awk '/^Mem:/ {print $2}')
overrides=""  # slurmd rejects a node with more CPUs than it finds unless told to trust the config
((cpus > real_cpus)) && overrides="SlurmdParameters=config_overrides"
write /etc/slurm/slurm.conf <<EOF
ClusterName=$cluster
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire + 1 s before it may start again (default 120 s).
AuthInfo=cred_expire=30
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd.log
# No cgroups here (containers, no systemd): track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
# Jobs share the node CPU by CPU; memory is not a consumable.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
$overrides
# Pending jobs get looked at every 5 s (default 60): a job whose BeginTime passes (a requeued
# one) is no event that would wake the scheduler.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
JobRequeue=1
ReturnToService=2
KillWait=30
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# --- daemons -------------------------------------------------------------------------------------
pid() { cat "/run/$1.pid" 2>/dev/null; }
alive() { local p; p=$(pid "$1") && kill -0 "$p" 2>/dev/null; }
if ((changed)); then # a changed config needs fresh daemons (running jobs survive this)
  for d in slurmd slurmctld slurmdbd; do alive "$d" && kill "$(pid "$d")"; done
  for d in slurmd slurmctld slurmdbd; do while alive "$d"; do sleep 0.2; done; done
fi
alive slurmdbd || slurmdbd
retry sacctmgr -n list cluster || die "slurmdbd does not answer, see $log/slurmdbd.log"
# slurmctld only records accounting for a cluster that slurmdbd knows.
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$cluster"; then
  sacctmgr -i add cluster "$cluster" >/dev/null
fi
alive slurmctld || slurmctld
alive slurmd || slurmd

# Usable: idle, or running jobs already (mix, alloc); a trailing * would mean not responding.
ready() {
  [[ $(sinfo -h -N -n "$host" -o %t) =~ ^(idle|mix|alloc)$ ]] && sacct -n -X >/dev/null
}
for _ in $(seq 120); do ready 2>/dev/null && break; sleep 0.5; done
ready 2>/dev/null || die "node $host unusable after 60 s: $(sinfo -h -N -o '%t %E' 2>&1), see $log"
echo "slurm up: node $host, $cpus cpus, partition debug (took $((SECONDS - start))s)"
