#!/usr/bin/env bash
# A one-node SLURM on this machine for the remote tests: munge, slurmctld and slurmd on localhost.
# Needs root and Debian's slurm-wlm and munge (.ci/run installs them). Idempotent: a running cluster is left alone.
set -euo pipefail
if [ -S /run/munge/munge.socket.2 ] && timeout 5 sinfo -h >/dev/null 2>&1; then exit 0; fi
HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
[ -S /run/munge/munge.socket.2 ] || runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=traindeck-test
SlurmctldHost=$HOST
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
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
pkill -x slurmctld || true; pkill -x slurmd || true; sleep 0.5
/usr/sbin/slurmctld
/usr/sbin/slurmd
for _ in $(seq 50); do
  if timeout 5 sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then exit 0; fi
  sleep 0.2
done
echo "slurm did not come up: $(sinfo 2>&1 | tail -1)" >&2
exit 1
