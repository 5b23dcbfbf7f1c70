#!/usr/bin/env bash
# Stop the SLURM test cluster started by tests/slurm/start.sh: cancels every job, shuts slurmctld
# and the slurmd down (`scontrol shutdown`), stops munged if start.sh started it, and removes the
# /etc/hosts lines start.sh added for n1, n2.
# Safe to run when nothing is running.
#
#   sudo tests/slurm/stop.sh
set -uo pipefail
STATE_DIR=/run/entropyrl-slurm

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if command -v scontrol >/dev/null && alive /run/slurmctld.pid; then
  scancel --quiet --user root 2>/dev/null || true
  scontrol shutdown >/dev/null 2>&1 || true
fi
for pidfile in /run/slurmctld.pid /run/slurmd.pid /run/slurmd-*.pid; do
  for _ in $(seq 1 50); do alive "$pidfile" || break; sleep 0.2; done
  if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
done
if [[ -f "$STATE_DIR/munged-started-by-us" ]]; then
  if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
  rm -f "$STATE_DIR/munged-started-by-us"
fi
if grep -q "# entropyrl-slurm" /etc/hosts 2>/dev/null; then
  # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file
  kept=$(grep -v "# entropyrl-slurm" /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
fi
echo "stop.sh: SLURM stopped" >&2
exit 0
