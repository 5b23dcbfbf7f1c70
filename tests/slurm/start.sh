#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine for the tests.
# Idempotent: installs slurmctld/slurmd/munge with apt-get only when missing, (re)writes
# /etc/slurm/slurm.conf, starts munged, slurmctld and slurmd only when they are not running, and
# waits until `sinfo` shows the node idle. Needs root. Stop it with tests/slurm/stop.sh.
#
#   sudo tests/slurm/start.sh && sinfo && sbatch --wrap "hostname"
#
# Exit status: 0 ready; 3 cannot run here (not root / no apt-get); 1 failed to start (see logs
# under /var/log/slurm/).
set -euo pipefail

STATE_DIR=/run/entropyrl-slurm
LOG_DIR=/var/log/slurm

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

mkdir -p "$STATE_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/munge /var/log/munge

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
# Written by entropyrl tests/slurm/start.sh: a single-node test cluster.
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
DefMemPerCPU=1024
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=${HOST} CPUs=${CPUS} RealMemory=${REAL_MEM} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
CONF
)
CONF_CHANGED=0
if [[ ! -f /etc/slurm/slurm.conf ]] || [[ "$(cat /etc/slurm/slurm.conf)" != "$CONF" ]]; then
  printf '%s\n' "$CONF" > /etc/slurm/slurm.conf
  CONF_CHANGED=1
fi

alive() {  # alive PIDFILE: the daemon whose pid is in PIDFILE runs
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

if alive /run/slurmctld.pid && [[ $CONF_CHANGED -eq 1 ]]; then
  scontrol reconfigure >/dev/null 2>&1 || true
fi
if ! alive /run/slurmctld.pid; then
  slurmctld || { echo "start.sh: slurmctld failed to start; see ${LOG_DIR}/slurmctld.log" >&2; exit 1; }
fi
for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
if ! alive /run/slurmd.pid; then
  slurmd || { echo "start.sh: slurmd failed to start; see ${LOG_DIR}/slurmd.log" >&2; exit 1; }
fi

# --- wait until the node is idle -------------------------------------------------------------
for i in $(seq 1 120); do
  state=$(sinfo -h -n "$HOST" -o "%T" 2>/dev/null | head -n1 || true)
  case "$state" in
    idle|mixed|allocated|completing) echo "start.sh: SLURM ready (node ${HOST} ${state}, partition debug)" >&2; exit 0 ;;
    down*|drain*|drained*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
echo "start.sh: node ${HOST} did not become idle (sinfo: ${state:-nothing}); see ${LOG_DIR}/slurmctld.log and slurmd.log" >&2
exit 1
