"""The run queue: runs waiting in the runs directory, worked by a scheduler process that outlives the app.

Torch-free. A queued run is an ordinary run directory whose `status.json` says `state: queued`, with a `queue`
record: its position, whether it is held (paused), the sweep it belongs to, and once started the scheduler's pid
and the GPUs it was given. Every change to the queue happens under one lock file in the runs directory, so two
schedulers never claim the same run and the app's edits never interleave with a claim.

A scheduler (`main.py queue run`) claims the first waiting run that fits (placement), launches
`main.py resume RUN_DIR` for it (a queued run without a checkpoint starts from scratch), and keeps going when a run
fails. Its children watch it: if it dies they checkpoint and stop (trainer/core/system.py's `on_stop`); the next
scheduler puts the runs a dead scheduler owned back at the head of the queue, where they resume from their
checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from trainer.core.config import ConfigError, RunConfig, load_config, save_config
from trainer.core.rundir import RunDir, list_runs
from trainer.core.system import WATCH_PARENT_ENV, detached, locked, on_stop, pid_alive, stop_tree

LOCK = ".queue.lock"
RETRYABLE_STATES = ("stopped", "preempted", "failed", "diverged")  # what Retry queues again
SCHEDULERS = ".schedulers"  # one file per live scheduler: <pid>
SCHEDULER_LOG = "scheduler.log"  # in SCHEDULERS: what a scheduler the app started writes
POLL_S = 1.0
ENDING_S = 60  # a run's process has at most this long from recording its end to exiting (else its pid is another's)
BUSY_UTILIZATION = 30  # % — another user's job keeping a GPU this busy makes it unavailable
BUSY_MEMORY_FRACTION = 0.2  # or holding this share of its memory


@contextlib.contextmanager
def queue_lock(runs_dir: Path):
    """The runs directory's queue lock, held for the block (released by the OS if the holder dies)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    with locked(runs_dir / LOCK):
        yield


def damaged_runs(runs_dir: Path) -> list[tuple[RunDir, str]]:
    """The runs whose own files cannot be trusted (RunDir.damage), each with why: listed, never started."""
    return [(r, why) for r in list_runs(runs_dir) if (why := r.damage())]


def queued(runs_dir: Path) -> list[RunDir]:
    """Runs waiting, in queue order (held ones included)."""
    runs = [r for r in list_runs(runs_dir) if r.read_status().get("state") == "queued"]
    return sorted(runs, key=lambda r: (r.read_status().get("queue", {}).get("position", 0), r.name))


def add(runs_dir: Path, cfg: RunConfig, label: str | None = None, sweep: str | None = None,
        values: dict | None = None, checked: bool = False) -> RunDir:
    """Queue a run of `cfg` at the end of the queue; its directory. Pre-flight first (unless `checked`): a refused
    config is raised and nothing is queued."""
    return add_many(runs_dir, [(cfg, label, values)], sweep=sweep, checked=checked)[0]


def add_many(runs_dir: Path, items: list[tuple[RunConfig, str | None, dict | None]], sweep: str | None = None,
             checked: bool = False) -> list[RunDir]:
    """Queue runs of (config, label, values) at the end of the queue, all or nothing: every run directory is
    prepared first, then all are marked queued under one hold of the queue lock (a scheduler sees none of them
    before all of them); a failure or an interrupt on the way removes the directories made."""
    from trainer.runs.prepare import prepare_run  # imports torch: the app queues through `main.py queue add`

    runs_dir = Path(runs_dir)
    made: list[RunDir] = []
    try:
        for cfg, label, _ in items:
            run, lock = prepare_run(cfg, runs_dir=runs_dir, label=label, checked=checked)
            lock.close()
            made.append(run)
        with queue_lock(runs_dir):
            last = max((r.read_status().get("queue", {}).get("position", 0) for r in queued(runs_dir)), default=0)
            for n, (run, (cfg, _, values)) in enumerate(zip(made, items), start=1):
                run.write_status(state="queued", message="waiting in the queue", model=cfg.model.name,
                                 dataset=cfg.data.train_dir,
                                 queue={"position": last + n, "added": time.time(), "held": False,
                                        "sweep": sweep, "values": values or {}})
    except BaseException:
        for run in made:  # ours, made just now, never started: nothing of the user's is in them
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    return made


def _edit(run: RunDir, **changes) -> None:
    status = run.read_status()
    run.write_status(queue={**status.get("queue", {}), **changes})


def hold(runs_dir: Path, run: RunDir, held: bool = True) -> None:
    """Pause (or release) a waiting run: the scheduler passes it over while it is held."""
    with queue_lock(runs_dir):
        if run.read_status().get("state") != "queued":
            raise ValueError(f"{run.path}: not waiting in the queue")
        _edit(run, held=held)


def move(runs_dir: Path, run: RunDir, to_index: int) -> None:
    """Put a waiting run at `to_index` in the queue (0 = next)."""
    with queue_lock(runs_dir):
        order = [r for r in queued(runs_dir) if r.path != run.path]
        order.insert(max(0, min(to_index, len(order))), run)
        for i, r in enumerate(order, start=1):
            _edit(r, position=i)


def remove(runs_dir: Path, run: RunDir) -> None:
    """Take a waiting run out of the queue (its directory stays, marked stopped, so nothing is lost)."""
    with queue_lock(runs_dir):
        if run.read_status().get("state") != "queued":
            raise ValueError(f"{run.path}: not waiting in the queue")
        run.write_status(state="stopped", message="removed from the queue before it started")
        _edit(run, removed=True)


def retry(runs_dir: Path, run: RunDir) -> None:
    """Queue a failed, diverged or stopped run again, at the end; it resumes from its last checkpoint."""
    with queue_lock(runs_dir):
        if run.is_live() or run.read_status().get("state") not in RETRYABLE_STATES:
            raise ValueError(f"{run.path}: only a failed, diverged, stopped or preempted run can be retried")
        positions = [r.read_status().get("queue", {}).get("position", 0) for r in queued(runs_dir)]
        run.write_status(state="queued", message="waiting in the queue (retry)")
        _edit(run, position=max(positions, default=0) + 1, held=False, scheduler=None, removed=False)


# ---- placement -------------------------------------------------------------------------------------
def busy_gpus(usage: list[dict], ours: set[int]) -> set[int]:
    """GPUs someone else keeps busy (NVML figures): high utilisation, or much memory held by processes that are
    not this queue's runs."""
    busy = set()
    for g in usage:
        if g["index"] in ours:
            continue
        total = g.get("memory_total_mb") or 0
        if (g.get("utilization") or 0) >= BUSY_UTILIZATION or (
                total and (g.get("memory_used_mb") or 0) >= BUSY_MEMORY_FRACTION * total):
            busy.add(g["index"])
    return busy


def place(cfg: RunConfig, running: list[dict], usage: list[dict], cpu_slots: int) -> list[int] | None:
    """The GPUs for a run of `cfg` ([] for a CPU run), disjoint from those of `running` runs (their `gpus` lists)
    and from GPUs busy with other users' work; None when it must wait."""
    if cfg.device.type != "cuda":
        cpu_running = sum(1 for r in running if not r["gpus"])
        return [] if cpu_running < cpu_slots else None
    need = len(cfg.device.gpus)
    taken = {g for r in running for g in r["gpus"]}
    free = [g["index"] for g in sorted(usage, key=lambda g: g["index"])
            if g["index"] not in taken and g["index"] not in busy_gpus(usage, taken)]
    return free[:need] if len(free) >= need else None


def gpu_usage() -> list[dict]:
    """Each GPU's memory and utilisation from NVML (nvidia-ml-py), including other users' processes; [] without
    NVML or GPUs."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            except pynvml.NVMLError:
                util = None
            name = pynvml.nvmlDeviceGetName(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_used_mb": mem.used / 2**20, "memory_total_mb": mem.total / 2**20,
                        "utilization": util})
        return out
    finally:
        pynvml.nvmlShutdown()


# ---- the scheduler ---------------------------------------------------------------------------------
def ending(status: dict) -> bool:
    """A run that has recorded its end while its process is still exiting (it has not given back its cores yet)."""
    ended = status.get("ended")
    return (isinstance(ended, (int, float)) and 0 <= time.time() - ended < ENDING_S
            and pid_alive(status.get("pid")))


def live_schedulers(runs_dir: Path) -> list[int]:
    folder = Path(runs_dir) / SCHEDULERS
    pids = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return [pid for pid in pids if pid_alive(pid)]


class Scheduler:
    """Works the queue of one runs directory until stopped (or, with until_empty, until nothing is waiting)."""

    def __init__(self, runs_dir: Path, cpu_slots: int = 1, usage=gpu_usage, log=print):
        self.runs_dir = Path(runs_dir)
        self.cpu_slots = cpu_slots
        self.usage = usage
        self.log = log
        self.children: dict[Path, tuple[subprocess.Popen, list[int]]] = {}
        self.stopping = False
        self.marker = self.runs_dir / SCHEDULERS / str(os.getpid())

    def run(self, until_empty: bool = False) -> int:
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.write_text(str(time.time()))
        on_stop(lambda why: setattr(self, "stopping", True))
        try:
            while not self.stopping:
                self.reap()
                started = self.start_what_fits()
                if until_empty and not self.children and not started and not self._waiting():
                    break
                time.sleep(POLL_S)
        finally:
            for proc, _ in self.children.values():
                stop_tree(proc.pid)  # each checkpoints and stops; the next scheduler resumes it
            for proc, _ in self.children.values():
                proc.wait()
            self.marker.unlink(missing_ok=True)
        return 0

    def _waiting(self) -> bool:
        return any(not r.read_status().get("queue", {}).get("held") for r in queued(self.runs_dir))

    def reap(self) -> None:
        for path, (proc, _) in list(self.children.items()):
            code = proc.poll()
            if code is not None:
                del self.children[path]
                run = RunDir(path)
                if run.read_status().get("state") in ("queued", "starting", "running"):  # refused or died early
                    run.write_status(state="failed", message=_last_error(run, code), exit_code=code)
                _edit(run, scheduler=None, ended=time.time())  # done as far as the queue goes: never recovered
                self.log(f"{path.name}: {run.read_status().get('state')} (exit {code})")

    def start_what_fits(self) -> int:
        """Claim and launch waiting runs while placement allows; how many were started."""
        started = 0
        with queue_lock(self.runs_dir):
            self.recover()
            running = self._running()
            usage = self.usage()
            for run in queued(self.runs_dir):
                q = run.read_status().get("queue", {})
                if q.get("held") or pid_alive(q.get("scheduler")):  # paused, or being started by a scheduler
                    continue
                try:
                    cfg = load_config(run.config)
                except ConfigError as e:
                    run.write_status(state="failed", message=str(e), exit_code=2)
                    continue
                gpus = place(cfg, running, usage, self.cpu_slots)
                if gpus is None:
                    if cfg.device.type != "cuda":
                        break  # keep the queue's order for CPU runs
                    continue
                self._launch(run, cfg, gpus)
                running.append({"gpus": gpus})
                started += 1
        return started

    def _running(self) -> list[dict]:
        """The runs going in this runs directory now, with their GPUs: those its schedulers started, and those started
        from the window or a command line (issue #71: a queued run started while the window's run was still
        exporting, two jobs on two cores); a run holds its place until its test set and exports are done."""
        out = []
        for r in list_runs(self.runs_dir):
            status = r.read_status()
            q = status.get("queue") or {}
            if status.get("state") in ("queued", "starting", "running") and pid_alive(q.get("scheduler")):
                out.append({"gpus": q.get("gpus") or []})
            elif not q and not r.is_remote and (r.is_live() or ending(status)):
                try:
                    device = load_config(r.config).device
                except (ConfigError, OSError):
                    out.append({"gpus": []})  # unreadable: it still takes a place
                    continue
                out.append({"gpus": list(device.gpus) if device.type == "cuda" else []})
        return out

    def _launch(self, run: RunDir, cfg: RunConfig, gpus: list[int]) -> None:
        from trainer.runs.launch import resume_command

        env = dict(os.environ, **{WATCH_PARENT_ENV: str(os.getpid())})  # it stops when this scheduler is gone
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            if cfg.device.gpus != list(range(len(gpus))):  # the run sees its GPUs as 0..n-1
                cfg.device.gpus = list(range(len(gpus)))
                save_config(cfg, run.config)
        # still `queued` (the trainer itself writes `starting`), but claimed: no other scheduler takes it
        _edit(run, scheduler=os.getpid(), gpus=gpus, started=time.time())
        out = open(run.output_log, "ab")
        proc = subprocess.Popen(resume_command(run.path), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **detached(env))
        out.close()
        self.children[run.path] = (proc, gpus)
        self.log(f"{run.name}: started" + (f" on GPU {','.join(map(str, gpus))}" if gpus else ""))

    def recover(self) -> None:
        """Put back at the head of the queue the runs a scheduler that is gone had going (they stopped, or were
        killed, part-way): they resume from their checkpoints. Called under the queue lock."""
        for r in list_runs(self.runs_dir):
            status = r.read_status()
            q = status.get("queue") or {}
            owner = q.get("scheduler")
            if not owner or owner == os.getpid() or pid_alive(owner) or q.get("removed"):
                continue
            if status.get("state") in ("queued", "starting", "running", "stopped") and not r.is_live():
                r.write_status(state="queued", message="its scheduler ended part-way; it resumes from its checkpoint")
                _edit(r, position=0, scheduler=None)
                self.log(f"{r.name}: back in the queue (its scheduler ended part-way)")


def _last_error(run: RunDir, code: int) -> str:
    """What a trainer that ended before recording its end said last (a refused input: `error: ...`)."""
    try:
        lines = [line.strip() for line in run.output_log.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        lines = []
    if lines:
        return lines[-1].removeprefix("error: ")
    return f"the trainer exited with code {code} before recording how the run ended"


def main_loop(runs_dir: Path, until_empty: bool, cpu_slots: int) -> int:
    return Scheduler(runs_dir, cpu_slots, log=lambda m: print(m, flush=True, file=sys.stderr)).run(until_empty)
