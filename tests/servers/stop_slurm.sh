#!/usr/bin/env bash
# Stop the one-node test cluster that tests/servers/start_slurm.sh started: its jobs, then its slurmctld and slurmd (by
# the pid files in its own folder; a machine's own SLURM is never touched). .ci/run calls it when the suite ends.
set -uo pipefail
DIR=${TRAINDECK_TEST_SLURM:-/tmp/traindeck-test-slurm}
export SLURM_CONF=$DIR/slurm.conf
[ -s "$SLURM_CONF" ] || exit 0
timeout 10 scancel --user "$(id -un)" 2>/dev/null
pids=()
for pidfile in "$DIR/slurmctld.pid" "$DIR/slurmd.pid"; do
  [ -s "$pidfile" ] && pids+=("$(cat "$pidfile")") && rm -f "$pidfile"
done
[ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
for _ in $(seq 50); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && exit 0
  sleep 0.2
done
kill -9 "${pids[@]}" 2>/dev/null
exit 0
