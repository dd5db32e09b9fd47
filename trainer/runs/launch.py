"""Command lines that start a run: the worker processes and the equivalent `main.py train` command.

Torch-free, shared by the CLI (which launches) and the app (which shows "Copy command").
"""

from __future__ import annotations

import math
import shlex
import socket
import sys
from pathlib import Path

from trainer.core.config import RunConfig
from trainer.core.rundir import EXIT_PREEMPTED
from trainer.runs.commands import Resume, Train

REPO_ROOT = Path(__file__).resolve().parents[2]  # trainer/runs/launch.py -> the repository


def free_port() -> int:
    """A TCP port free on loopback right now (the rendezvous binds to it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main_command(*args: str | Path) -> list[str]:
    """`python main.py ARGS` with this interpreter: how the app starts every helper process."""
    return [sys.executable, str(REPO_ROOT / "main.py"), *map(str, args)]


def worker_module_args(run_dir: str | Path, resume: bool) -> list[str]:
    return ["-m", "trainer.runs.worker", str(run_dir)] + (["--resume"] if resume else [])


def torchrun_command(cfg: RunConfig, run_dir: str | Path, resume: bool, port: int) -> list[str]:
    dev = cfg.device
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={dev.nproc}",
            f"--nnodes={dev.nnodes}", f"--node-rank={dev.node_rank}", f"--master-addr={dev.master_addr}",
            f"--master-port={port}", f"--max-restarts={dev.max_restarts}", *worker_module_args(run_dir, resume)]


def horovodrun_command(cfg: RunConfig, run_dir: str | Path, resume: bool) -> list[str]:
    """horovodrun (as its module, with this interpreter) over nproc workers on this machine."""
    n = cfg.device.nproc
    return [sys.executable, "-m", "horovod.runner.launch", "-np", str(n), "-H", f"localhost:{n}",
            sys.executable, *worker_module_args(run_dir, resume)]


def train_command(config_path: str | Path, run_dir: str | Path | None = None, overrides: list[str] | None = None,
                  runs_dir: str | Path | None = None, output_log: str | Path | None = None,
                  overwrite: bool = False) -> list[str]:
    """`python main.py train CONFIG ...` as an argument list."""
    return main_command(*Train(config=str(config_path), set=list(overrides or []), run_dir=_text(run_dir),
                               runs_dir=None if run_dir else _text(runs_dir), output_log=_text(output_log),
                               overwrite=overwrite).argv())


def headless_command(config_path: str | Path, runs_dir: str | Path) -> list[str]:
    """`python main.py train CONFIG --runs-dir DIR` as a user types it in the repository (the app's Command)."""
    return ["python", "main.py", *Train(config=str(config_path), runs_dir=str(runs_dir)).argv()]


def resume_command(run_dir: str | Path, epochs: int | None = None) -> list[str]:
    """Continue a run; with `epochs`, extend it to that many epochs in all (trainer/core/schedule.py's rule)."""
    return main_command(*Resume(run_dir=str(run_dir), epochs=epochs or None).argv())


def _text(path: str | Path | None) -> str | None:
    return None if path in (None, "") else str(path)


def node_commands(config_path: str | Path, cfg: RunConfig) -> list[str]:
    """One shell command per node for a multi-node run (the same config, a different node_rank)."""
    out = []
    for node in range(cfg.device.nnodes):
        sets = [f"device.node_rank={node}"]
        out.append(shlex.join(["python", "main.py", "train", str(config_path), "--set", *sets]))
    return out


SLURM_PER_NODE = """RUN=$RUNS/slurm-$SLURM_JOB_ID; if [ "$SLURM_NODEID" != 0 ]; then RUN=$RUN-node$SLURM_NODEID; fi
exec "$PYTHON" main.py train "$CONFIG" --run-dir "$RUN" --resumable --set device.nnodes=$SLURM_NNODES \\
  device.node_rank=$SLURM_NODEID device.master_addr=$MASTER_ADDR"""
# After the job's step: a run that ended preempted (SLURM's warning signal, exit EXIT_PREEMPTED) requeues its job,
# which starts again in the same run directory (train --resumable), up to REQUEUE_LIMIT times.
SLURM_REQUEUE = """code=0
srun --kill-on-bad-exit=1 bash -c '{per_node}' || code=$?
if [ "$code" = {preempted} ]; then
  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$REQUEUE_LIMIT" ]; then
    echo "traindeck: preempted; requeueing job $SLURM_JOB_ID (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of $REQUEUE_LIMIT)"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
  else
    echo "traindeck: preempted, and requeued $REQUEUE_LIMIT times already (device.requeue_limit): not again"
  fi
fi
exit $code"""


def slurm_time_limit(cfg: RunConfig) -> tuple[int | None, str]:
    """(sbatch --time in minutes or None, why): device.slurm_time_min when given, else train.budget and a quarter more
    (the start, the test set and the export), else none: the partition's own limit applies."""
    if cfg.device.slurm_time_min:
        return cfg.device.slurm_time_min, "device.slurm_time_min"
    if cfg.train.budget:
        minutes = math.ceil(cfg.train.budget * 1.25 + 2)
        return minutes, f"train.budget {cfg.train.budget:g} min, a quarter more and 2 min for the start and the end"
    return None, "no device.slurm_time_min nor train.budget: the partition's own limit applies"


def write_slurm_files(cfg: RunConfig, script: str | Path, runs_dir: str | Path, cpus_per_task: int | None = None) -> Path:
    """The resolved config beside `script` (NAME.config.yaml) and the batch script that trains it; the config's path."""
    from trainer.core.config import save_config

    script = Path(script).resolve()
    config_path = script.with_name(script.stem + ".config.yaml")
    save_config(cfg, config_path)
    script.write_text(slurm_script(config_path, cfg, Path(runs_dir).resolve(), cpus_per_task=cpus_per_task),
                      encoding="utf-8")
    return config_path


LARGE_CPU_REQUEST = 16  # per node: above this the script says where the number comes from and how to lower it


def slurm_cpus_per_task(cfg: RunConfig, override: int | None = None) -> tuple[int, str]:
    """(CPUs one node's task asks for, a comment saying why). Never more than the config asks for: each process
    plus the data-loader workers it sets; with `data.num_workers: -1` (auto) one CPU per process, because the
    trainer then uses the CPUs it is given (a request a small node cannot meet pends forever)."""
    nproc = cfg.device.nproc
    if override is not None:
        return override, "--cpus-per-task as given"
    if cfg.data.num_workers >= 0:
        cpus = nproc * (cfg.data.num_workers + 1)
        why = f"{nproc} process(es) x (data.num_workers {cfg.data.num_workers} + 1)"
    else:
        cpus = nproc
        why = (f"{nproc} process(es), one CPU each: data.num_workers is auto, so the trainer uses as many loader "
               f"workers as the CPUs it is given allow; ask for more with --cpus-per-task")
    if cpus > LARGE_CPU_REQUEST:
        why += (". A large request: a node with fewer CPUs never starts it (squeue reason PartitionConfig or "
                "Resources); lower data.num_workers or pass --cpus-per-task")
    return cpus, why


def slurm_script(config_path: str | Path, cfg: RunConfig, runs_dir: str | Path, job_name: str = "traindeck",
                 cpus_per_task: int | None = None) -> str:
    """A SLURM batch script that trains exactly `cfg`, already written (resolved) to `config_path`.

    One task per node; each runs `main.py train` on that config with the node's rank, under the interpreter
    TrainDeck runs under now. Only the node-specific keys are set on the command line. Node 0's run directory
    is `runs_dir`/slurm-JOBID (the one with the events and checkpoints); the other nodes' get -nodeN.
    """
    dev = cfg.device
    gpus = f"#SBATCH --gpus-per-node={dev.nproc}\n" if dev.type == "cuda" else ""
    cpus, why = slurm_cpus_per_task(cfg, cpus_per_task)
    minutes, why_time = slurm_time_limit(cfg)
    limit = f"#SBATCH --time={minutes}" if minutes else "##SBATCH --time=02:00:00"
    warning = min(dev.slurm_warning_s, minutes * 15) if minutes else dev.slurm_warning_s  # at most a quarter of it
    # One node: the job requeues itself after a preemption and goes on in its run directory. Several: not yet (the
    # other nodes' ranks would start from their own run directories, which hold no checkpoint, out of step).
    requeue = dev.nnodes == 1
    comeback = ("# Before the time limit or a preemption SLURM warns the trainer (device.slurm_warning_s, at most a "
                "quarter of the\n# limit): it checkpoints, ends `preempted`, and this job requeues itself and goes "
                "on in the same run directory\n# (device.requeue_limit times).\n"
                f"#SBATCH --signal=USR1@{warning}\n#SBATCH --requeue" if requeue else
                "# Before the time limit SLURM warns the trainer (device.slurm_warning_s): it checkpoints and ends "
                "`preempted`;\n# resume it with main.py resume (a job of several nodes does not requeue itself yet)."
                f"\n#SBATCH --signal=USR1@{warning}\n#SBATCH --no-requeue")
    per_node = SLURM_PER_NODE if requeue else SLURM_PER_NODE.replace(" --resumable", "")
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={dev.nnodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --cpus-per-task={cpus}
# cpus-per-task: {why}
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
{limit}
# time: {why_time}
{comeback}
##SBATCH --partition=YOUR_PARTITION
# Generated by TrainDeck. It trains {config_path} (the resolved config, overrides included).
# Submit with: sbatch THIS_FILE
set -euo pipefail
# The Python environment TrainDeck is installed in. If the compute nodes need more to reach it, edit:
# module load cuda
# source {shlex.quote(str(Path(sys.executable).parent / "activate"))}
export PYTHON={shlex.quote(sys.executable)}
export CONFIG={shlex.quote(str(config_path))}
export RUNS={shlex.quote(str(runs_dir))}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export REQUEUE_LIMIT={dev.requeue_limit if requeue else 0}
cd {shlex.quote(str(REPO_ROOT))}
{SLURM_REQUEUE.format(per_node=per_node, preempted=EXIT_PREEMPTED)}
"""


def slurm_auto_script(folder: str, minutes: float, overrides: list[str], runs_dir: str | Path, cpus: int,
                      gpus: int, labels: str | None = None) -> str:
    """A SLURM batch script that runs Auto inside the job: the node it lands on scans `folder`, measures and plans
    (the plan is made where the run runs), then trains into RUNS/slurm-JOBID. `--minutes` counts from the job's
    start: the time it pends is not spent."""
    gres = f"#SBATCH --gpus-per-node={gpus}\n" if gpus else ""
    sets = f" --labels {shlex.quote(labels)}" if labels else ""
    sets += f" --set {shlex.join(overrides)}" if overrides else ""
    return f"""#!/bin/bash
#SBATCH --job-name=traindeck-auto
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
{gres}#SBATCH --cpus-per-task={cpus}
# Generated by TrainDeck: Auto ({minutes:g} min from the job's start) on {folder}, planned on the job's node.
set -euo pipefail
export PYTHON={shlex.quote(sys.executable)}
export RUNS={shlex.quote(str(Path(runs_dir)))}
cd {shlex.quote(str(REPO_ROOT))}
exec "$PYTHON" main.py auto {shlex.quote(folder)} --minutes {minutes:g} --run-dir "$RUNS/slurm-$SLURM_JOB_ID"{sets}
"""


SLURM_ARRAY_TASK = ('exec "$PYTHON" main.py train "$TRIALS/trial-$(printf %03d "$SLURM_ARRAY_TASK_ID").yaml" \\\n'
                    '  --run-dir "$RUNS/$SWEEP-$(printf %03d "$SLURM_ARRAY_TASK_ID")"')


def write_slurm_array(sweep, script: str | Path, runs_dir: str | Path, cpus_per_task: int | None = None) -> Path:
    """A SLURM job array for a grid or random sweep: one resolved config per trial in NAME.trials/ beside
    `script`, and the script whose task K trains trial K (into RUNS/SWEEP-K). The trials' folder."""
    from trainer.core.config import save_config

    script = Path(script).resolve()
    trials = script.with_name(script.stem + ".trials")
    trials.mkdir(parents=True, exist_ok=True)
    configs = [sweep.config(values) for values in sweep.trials_values()]
    for i, cfg in enumerate(configs, start=1):
        save_config(cfg, trials / f"trial-{i:03d}.yaml")
    first = configs[0]
    gpus = f"#SBATCH --gpus-per-task={len(first.device.gpus)}\n" if first.device.type == "cuda" else ""
    cpus, why = slurm_cpus_per_task(first, cpus_per_task)
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name={sweep.name}
#SBATCH --array=1-{len(configs)}
#SBATCH --ntasks=1
{gpus}#SBATCH --cpus-per-task={cpus}
# cpus-per-task: {why}
#SBATCH --output=%x-%A_%a.out
##SBATCH --time=02:00:00          # set your limit
##SBATCH --partition=YOUR_PARTITION
# Generated by TrainDeck: sweep {sweep.name}, {len(configs)} trials, one per array task ({trials}/trial-K.yaml).
# Submit with: sbatch THIS_FILE
set -euo pipefail
# module load cuda
# source {shlex.quote(str(Path(sys.executable).parent / "activate"))}
export PYTHON={shlex.quote(sys.executable)}
export TRIALS={shlex.quote(str(trials))}
export RUNS={shlex.quote(str(Path(runs_dir).resolve()))}
export SWEEP={shlex.quote(sweep.name)}
cd {shlex.quote(str(REPO_ROOT))}
{SLURM_ARRAY_TASK}
""", encoding="utf-8")
    return trials
