#!/usr/bin/env bash
# A one-node SLURM on this machine for the remote tests: munge, slurmctld and slurmd on localhost.
# Needs root and Debian's slurm-wlm and munge (.ci/run installs them). Idempotent: a working cluster is left alone.
# Gives up after about a minute, saying why (the daemons' logs), so a test run never waits on it for long.
set -uo pipefail
munge_works() { timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }
slurm_up() { timeout 3 sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; }
if munge_works && slurm_up; then exit 0; fi
HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
if ! munge_works; then
  # A socket left by a munged that is gone (a machine restored from a snapshot) makes a plain start refuse: --force.
  pkill -x munged 2>/dev/null; sleep 0.3
  runuser -u munge -- /usr/sbin/munged --force 2>/dev/null || /usr/sbin/munged --force
  for _ in $(seq 25); do munge_works && break; sleep 0.2; done
  munge_works || { echo "munge does not work: $(munge -n </dev/null 2>&1 | tail -1); $(tail -3 /var/log/munge/munged.log 2>/dev/null)" >&2; exit 1; }
fi
# Addresses are given, so a host name that does not resolve does not matter.
cat > /etc/slurm/slurm.conf <<CONF
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
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
KillWait=30
JobAcctGatherType=jobacct_gather/none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
pkill -x slurmctld 2>/dev/null; pkill -x slurmd 2>/dev/null; sleep 0.5
/usr/sbin/slurmctld || { echo "slurmctld did not start: $(tail -3 /var/log/slurm/slurmctld.log 2>/dev/null)" >&2; exit 1; }
/usr/sbin/slurmd -N "$HOST" || { echo "slurmd did not start: $(tail -3 /var/log/slurm/slurmd.log 2>/dev/null)" >&2; exit 1; }
deadline=$(( $(date +%s) + 45 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  slurm_up && exit 0
  sleep 0.3
done
echo "slurm did not come up in 45 s: $(timeout 5 sinfo 2>&1 | tail -1)" >&2
echo "slurmctld.log: $(tail -3 /var/log/slurm/slurmctld.log 2>/dev/null)" >&2
echo "slurmd.log: $(tail -3 /var/log/slurm/slurmd.log 2>/dev/null)" >&2
exit 1
