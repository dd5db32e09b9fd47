"""SLURM on the login node: does a request fit the partition (sinfo), submit (sbatch --parsable), a job's state
(squeue, then scontrol, then sacct), cancel (scancel). Torch-free; run there by the agent (trainer/remote/agent.py).

The batch scripts themselves come from `trainer.runs.launch` (the same `main.py slurm` writes).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from trainer.core.errors import InputError

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT")


class SlurmError(InputError):
    """SLURM refused or cannot serve a request (the reason named): exit 2."""


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed here: this host is not a SLURM login node "
                         f"(set its scheduler to ssh)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` gave no answer in {timeout:.0f} s (is slurmctld up?)") from None


@dataclass
class Partition:
    name: str
    nodes: int
    cpus: int  # the most CPUs one node has
    gpus: int  # the most GPUs (gres gpu) one node has
    memory_mb: int
    default: bool


def partitions() -> list[Partition]:
    done = _run(["sinfo", "-h", "-o", "%P|%D|%c|%G|%m|%a"])
    if done.returncode != 0:
        raise SlurmError(f"sinfo failed: {done.stderr.strip() or done.returncode}")
    out: dict[str, Partition] = {}
    for line in done.stdout.splitlines():
        name, nodes, cpus, gres, memory, avail = (line.split("|") + [""] * 6)[:6]
        if avail.strip() not in ("up", ""):
            continue
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = 0
        for item in gres.split(","):
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu" and parts[-1].isdigit():
                gpus = max(gpus, int(parts[-1]))
        p = out.setdefault(name, Partition(name, 0, 0, 0, 0, default))
        p.nodes += int(nodes or 0)
        p.cpus = max(p.cpus, int(cpus.rstrip("+") or 0))
        p.gpus = max(p.gpus, gpus)
        p.memory_mb = max(p.memory_mb, int(memory.rstrip("+") or 0))
    return list(out.values())


def check_request(partition: str, nodes: int, cpus_per_task: int, gpus_per_node: int) -> Partition:
    """The partition a request goes to, or SlurmError naming the limit no node can meet (before submitting: SLURM
    would otherwise leave it pending forever)."""
    found = partitions()
    if not found:
        raise SlurmError("sinfo lists no partition that is up")
    chosen = next((p for p in found if p.name == partition), None) if partition else \
        next((p for p in found if p.default), found[0])
    if chosen is None:
        raise SlurmError(f"partition {partition!r} is not on this cluster (sinfo lists: "
                         f"{', '.join(p.name for p in found)})")
    if nodes > chosen.nodes:
        raise SlurmError(f"device.nnodes {nodes}: partition {chosen.name} has {chosen.nodes} node(s)")
    if cpus_per_task > chosen.cpus:
        raise SlurmError(f"--cpus-per-task {cpus_per_task}: no node of partition {chosen.name} has more than "
                         f"{chosen.cpus} CPUs (sinfo); lower data.num_workers or device.nproc")
    if gpus_per_node > chosen.gpus:
        raise SlurmError(f"{gpus_per_node} GPU(s) per node: partition {chosen.name}'s nodes have "
                         f"{chosen.gpus or 'no'} GPU(s) (sinfo gres); pick a GPU partition or device.type cpu")
    return chosen


def submit(script: str, partition: str, output: str, workdir: str) -> int:
    argv = ["sbatch", "--parsable", f"--output={output}", f"--chdir={workdir}"]
    if partition:
        argv.append(f"--partition={partition}")
    done = _run(argv + [script])
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise SlurmError(f"sbatch refused the job: {said[-1].removeprefix('sbatch: error: ') if said else done.returncode}")
    return int(done.stdout.strip().split(";")[0])


def job_state(job: int) -> dict:
    """{"state": PENDING|RUNNING|COMPLETED|FAILED|CANCELLED|..., "reason": why it waits or ended, "active": bool}."""
    done = _run(["squeue", "-h", "-j", str(job), "-o", "%T|%r"])
    line = done.stdout.strip() if done.returncode == 0 else ""
    if line:
        state, reason = (line.split("|") + [""])[:2]
    else:
        done = _run(["scontrol", "-o", "show", "job", str(job)])
        fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f) if done.returncode == 0 else {}
        state, reason = fields.get("JobState", ""), fields.get("Reason", "")
        if not state:
            done = _run(["sacct", "-n", "-X", "-P", "-j", str(job), "-o", "State"])
            state = done.stdout.strip().split("\n")[0].split()[0] if done.returncode == 0 and done.stdout.strip() else ""
    state = state or "GONE"  # aged out of slurmctld and no accounting: the run directory says how it ended
    return {"job": job, "state": state, "reason": "" if reason in ("None", "(null)") else reason,
            "active": state in ACTIVE}


def cancel(job: int) -> None:
    """scancel: SLURM sends SIGTERM to the job's processes (the trainer checkpoints) and SIGKILL after KillWait."""
    done = _run(["scancel", str(job)])
    if done.returncode != 0:
        raise SlurmError(f"scancel {job}: {done.stderr.strip()}")
