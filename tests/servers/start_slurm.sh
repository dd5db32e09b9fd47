#!/usr/bin/env bash
# A one-node SLURM on this machine for the remote tests: munge, slurmctld and slurmd on localhost.
# Needs root and Debian's slurm-wlm and munge (.ci/run installs them). Idempotent: a working test cluster is left alone.
# Gives up after about a minute, saying why (the daemons' logs), so a test run never waits on it for long.
# Everything of the test cluster lives in its own folder ($TRAINDECK_TEST_SLURM: its slurm.conf, state, logs and pid
# files; the tests point SLURM_CONF at it): a machine's own SLURM configuration (/etc/slurm) is never written, and only
# the daemons this script started (by their pid files) are ever stopped.
set -uo pipefail
DIR=${TRAINDECK_TEST_SLURM:-/tmp/traindeck-test-slurm}
export SLURM_CONF=$DIR/slurm.conf
munge_works() { timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
slurm_up() { [ -s "$SLURM_CONF" ] && timeout 3 sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; }
stop_ours() {  # the daemons of an earlier start of this script, by the pids they wrote in $DIR
  for pidfile in "$DIR/slurmctld.pid" "$DIR/slurmd.pid"; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
    rm -f "$pidfile"
  done
}
mkdir -p "$DIR"
# One start at a time. The daemons must not inherit the lock's descriptor (they would hold the lock for good): 9>&-.
exec 9>"$DIR/start.lock"; flock -w 100 9 || { echo "another start of the test cluster holds $DIR/start.lock" >&2; exit 1; }
if munge_works && slurm_up; then exit 0; fi
HOST=$(hostname -s)
CPUS=$(nproc --all)  # --all: not lowered by OMP_NUM_THREADS, which nproc honours (the suite sets it per worker)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$DIR/state" "$DIR/spool" /run/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
if ! munge_works; then
  # A socket left by a munged that is gone (a machine restored from a snapshot) makes a plain start refuse: --force.
  runuser -u munge -- /usr/sbin/munged --force 2>/dev/null 9>&- || /usr/sbin/munged --force 9>&-
  for _ in $(seq 25); do munge_works && break; sleep 0.2; done
  munge_works || { echo "munge does not work: $(munge -n </dev/null 2>&1 | tail -1); $(tail -3 /var/log/munge/munged.log 2>/dev/null)" >&2; exit 1; }
fi
# Addresses are given, so a host name that does not resolve does not matter.
cat > "$SLURM_CONF" <<CONF
ClusterName=traindeck-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
KillWait=30
JobAcctGatherType=jobacct_gather/none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
stop_ours; sleep 0.5
/usr/sbin/slurmctld -f "$SLURM_CONF" 9>&- || { echo "slurmctld did not start: $(tail -3 "$DIR/slurmctld.log" 2>/dev/null)" >&2; exit 1; }
/usr/sbin/slurmd -f "$SLURM_CONF" -N "$HOST" 9>&- || { echo "slurmd did not start: $(tail -3 "$DIR/slurmd.log" 2>/dev/null)" >&2; exit 1; }
deadline=$(( $(date +%s) + 45 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  slurm_up && exit 0
  sleep 0.3
done
echo "slurm did not come up in 45 s: $(timeout 5 sinfo 2>&1 | tail -1)" >&2
echo "slurmctld.log: $(tail -3 "$DIR/slurmctld.log" 2>/dev/null)" >&2
echo "slurmd.log: $(tail -3 "$DIR/slurmd.log" 2>/dev/null)" >&2
exit 1
