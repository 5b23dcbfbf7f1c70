#!/usr/bin/env bash
# Start the SLURM test cluster on this machine: partition `debug` (default) of one node named after
# the host, and partition `two` of two nodes `n1`, `n2` (two more slurmd on this host, ports
# 17001/17002, started as `slurmd -N n1` / `-N n2`; the names resolve to 127.0.0.1 through
# /etc/hosts lines this script adds) for multi-node jobs.
# Idempotent: installs slurmctld/slurmd/munge with apt-get only when missing, (re)writes
# /etc/slurm/slurm.conf (a changed file restarts the daemons this script runs), starts munged,
# slurmctld and the three slurmd only when they are not running, and waits until `sinfo` shows
# every node idle. Needs root. Stop it with tests/slurm/stop.sh.
# A slurmctld this script starts begins with no jobs (`slurmctld -c`, its own state folder): the jobs
# of an earlier test session whose processes are gone (a machine stopped mid-run keeps the state on
# disk) would otherwise hold the nodes and leave every later job pending. InactiveLimit releases an
# `srun` allocation whose srun died.
#
#   sudo tests/slurm/start.sh && sinfo && sbatch --wrap "hostname" && srun -p two -N 2 hostname
#
# Exit status: 0 ready; 3 cannot run here (not root / no apt-get); 1 failed to start (see logs
# under /var/log/slurm/).
set -euo pipefail

STATE_DIR=/run/entropyrl-slurm
LOG_DIR=/var/log/slurm
# slurmctld's saved jobs and nodes: the test cluster's own (not /var/spool/slurmctld, a real install's)
CTLD_STATE=/var/spool/entropyrl-slurmctld

if [[ $(id -u) -ne 0 ]]; then
  echo "start.sh: needs root to install and run slurmctld/slurmd (run as root or skip the slurm tests)" >&2
  exit 3
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sinfo >/dev/null \
   || ! command -v munged >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "start.sh: SLURM is not installed and apt-get is not available to install it" >&2
    exit 3
  fi
  echo "start.sh: installing slurmctld slurmd slurm-client munge (apt-get, about a minute)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

mkdir -p "$STATE_DIR" "$LOG_DIR" "$CTLD_STATE" /var/spool/slurmd /etc/slurm /run/munge /var/log/munge

# --- munge -------------------------------------------------------------------------------------
if [[ ! -s /etc/munge/munge.key ]]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
if ! (munge -n 2>/dev/null | unmunge >/dev/null 2>&1); then
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "munged --force" 2>/dev/null || munged --force
  else
    munged --force
  fi
  touch "$STATE_DIR/munged-started-by-us"
  for _ in $(seq 1 50); do (munge -n 2>/dev/null | unmunge >/dev/null 2>&1) && break; sleep 0.2; done
  if ! (munge -n | unmunge >/dev/null); then
    echo "start.sh: munged does not answer (munge -n | unmunge failed)" >&2
    exit 1
  fi
fi

# --- slurm.conf --------------------------------------------------------------------------------
HOST=$(hostname -s)
# `nproc` honours OMP_NUM_THREADS (which entropyrl exports for its children): count the CPUs we may use
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
REAL_MEM=$(( MEM_MB * 9 / 10 ))
CONF=$(cat <<CONF
# Written by entropyrl tests/slurm/start.sh: a one-node partition and a two-node one, on one host.
ClusterName=entropyrl-test
SlurmctldHost=${HOST}
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobRequeue=1
ReturnToService=2
# Jobs die fast on scancel/requeue (submitit ignores the first SIGTERM), completed jobs stay
# visible to squeue/scontrol for 10 minutes (there is no slurmdbd for sacct).
KillWait=2
MinJobAge=600
# an srun allocation whose srun is gone (killed with its test) is released after 2 minutes
InactiveLimit=120
DefMemPerCPU=1024
StateSaveLocation=${CTLD_STATE}
# Several slurmd on one host: each its own spool, pid file and log (%n: the node name)
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=${HOST} CPUs=${CPUS} RealMemory=${REAL_MEM} State=UNKNOWN
NodeName=n1 NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=17001 CPUs=${CPUS} RealMemory=${REAL_MEM} State=UNKNOWN
NodeName=n2 NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=17002 CPUs=${CPUS} RealMemory=${REAL_MEM} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
PartitionName=two Nodes=n1,n2 MaxTime=INFINITE State=UP
CONF
)
NODES=("$HOST" n1 n2)

# n1, n2 resolve to this host (the ranks of a two-node job meet at the first node's name)
for name in n1 n2; do
  if ! getent hosts "$name" >/dev/null; then
    echo "127.0.0.1 $name  # entropyrl-slurm" >> /etc/hosts
  fi
done
for name in "${NODES[@]}"; do mkdir -p "/var/spool/slurmd/$name"; done
CONF_CHANGED=0
if [[ ! -f /etc/slurm/slurm.conf ]] || [[ "$(cat /etc/slurm/slurm.conf)" != "$CONF" ]]; then
  printf '%s\n' "$CONF" > /etc/slurm/slurm.conf
  CONF_CHANGED=1
fi

alive() {  # alive PIDFILE: the daemon whose pid is in PIDFILE runs
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# A changed node set needs the daemons restarted (reconfigure cannot add nodes): stop what runs.
if [[ $CONF_CHANGED -eq 1 ]] && alive /run/slurmctld.pid; then
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do alive /run/slurmctld.pid || break; sleep 0.2; done
fi
if [[ $CONF_CHANGED -eq 1 ]]; then
  for pidfile in /run/slurmd.pid /run/slurmd-*.pid; do   # /run/slurmd.pid: an older start.sh's slurmd
    if alive "$pidfile"; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pidfile" || break; sleep 0.2; done
    fi
  done
fi
ctld_up() { timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; }
# a controller killed a moment ago may still hold its port: the new one exits; try a few times
for attempt in 1 2 3; do
  if ! alive /run/slurmctld.pid; then
    slurmctld -c || { echo "start.sh: slurmctld failed to start; see ${LOG_DIR}/slurmctld.log" >&2; exit 1; }
  fi
  for _ in $(seq 1 50); do ctld_up && break; sleep 0.2; done
  ctld_up && break
  sleep 2
done
if ! ctld_up; then
  echo "start.sh: slurmctld does not answer (scontrol ping); see ${LOG_DIR}/slurmctld.log" >&2
  exit 1
fi
for name in "${NODES[@]}"; do
  if ! alive "/run/slurmd-${name}.pid"; then
    slurmd -N "$name" || { echo "start.sh: slurmd -N ${name} failed to start; see ${LOG_DIR}/slurmd-${name}.log" >&2; exit 1; }
  fi
done

# --- wait until every node is idle -----------------------------------------------------------
deadline=$((SECONDS + 120))  # a bound on the wall time: each query is bounded too
while (( SECONDS < deadline )); do
  waiting=""
  for name in "${NODES[@]}"; do
    state=$(timeout 5 sinfo -h -n "$name" -o "%T" 2>/dev/null | head -n1 || true)
    case "$state" in
      idle|mixed|allocated|completing) ;;
      down*|drain*|drained*) scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true; waiting+=" $name:$state" ;;
      *) waiting+=" $name:${state:-nothing}" ;;
    esac
  done
  if [[ -z "$waiting" ]]; then
    echo "start.sh: SLURM ready (partition debug: node ${HOST}; partition two: nodes n1,n2)" >&2
    exit 0
  fi
  sleep 0.5
done
echo "start.sh: nodes did not become idle (${waiting# }); see ${LOG_DIR}/slurmctld.log and slurmd-<node>.log" >&2
exit 1
