"""Starting a run: prepare its directory, launch the worker(s) for the parallel mode, record the outcome.

`main.py train` and `main.py resume` call `launch`. For `parallel: none | dp` the worker runs in this
process; for `ddp` this process starts torchrun (or mp.spawn) and waits, so stopping this process's
group stops every rank. Whatever happens to the workers, status.json ends in a final state.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import subprocess
import sys
import threading
import time

from trainer.core.config import RunConfig
from trainer.core.rundir import FINAL_STATES, RunDir
from trainer.core.system import detached, ignoring_preempt_signal, on_stop, pass_stop_on, process_group
from trainer.runs.launch import REPO_ROOT, free_port, horovodrun_command, torchrun_command
from trainer.train.engine import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_FAILED, EXIT_OK, REQUEUE_ENV, run_worker

log = logging.getLogger(__name__)


def launch(run: RunDir, cfg: RunConfig, resume: bool = False, lock=None) -> int:
    """Run (or resume) the run in `run`, whose config.yaml is already written; returns the exit code.

    `lock` is the run directory's lock when the caller took it before writing the config (it is released here).
    """
    lock = lock or run.lock()
    try:
        return _launch_locked(run, cfg, resume)
    finally:
        lock.close()


def _launch_locked(run: RunDir, cfg: RunConfig, resume: bool) -> int:
    run.clear_rank_errors()
    before = run.read_status()
    now = time.time()
    run.write_status(state="starting", pid=os.getpid(), pgid=process_group(), started=now, message="", exit_code=None,
                     first_started=before.get("first_started") or before.get("started") or now,
                     earlier_s=earlier_seconds(before),
                     model=cfg.model.name, dataset=cfg.data.train_dir, parallel=cfg.device.parallel,
                     **(requeue_record(before, now) if resume else {}))
    dev = cfg.device
    if dev.parallel != "ddp":
        code = run_worker(str(run.path), resume)
    elif dev.launcher == "spawn":
        code = _spawn(run, cfg, resume)
    else:
        code = _run_launcher(run, cfg, resume)
    return _finalise(run, code)


def requeue_record(before: dict, now: float) -> dict:
    """status.json's record of a resumed run's requeues: how many times SLURM started its job again, and the time
    the run lost to them (from each end, or last sign of life, to the next start: the wait in the queue). {} when
    this process is not a requeued SLURM job's."""
    count = int(os.environ.get(REQUEUE_ENV) or 0)
    if count <= 0:
        return {}
    ended = before.get("ended") or before.get("updated") or now
    lost = float(before.get("requeue_lost_s") or 0.0) + max(0.0, now - ended)
    return {"requeues": count, "requeue_lost_s": round(lost, 1)}


def earlier_seconds(status: dict) -> float:
    """The time the run's earlier segments trained (a resumed or continued run's duration counts them all): the
    previous ones' and the last one's, from its start to its end (or its last status update, when it was killed)."""
    earlier = float(status.get("earlier_s") or 0.0)
    started, ended = status.get("started"), status.get("ended")
    if not ended or (started and ended < started):  # killed: no end of its own recorded
        ended = status.get("updated")
    if status.get("state") not in ("queued", None) and started and ended and ended > started:
        earlier += ended - started
    return earlier


def _finalise(run: RunDir, code: int) -> int:
    """Make sure status.json ends final; a rank other than 0 that failed is named in the message."""
    if not run.path.is_dir():
        log.error("the run directory %s was deleted while the run was going; nothing more could be saved", run.path)
        return code or EXIT_FAILED
    status = run.read_status()
    state, recorded = status.get("state"), status.get("exit_code")
    errors = run.rank_errors()
    if state in FINAL_STATES and recorded is not None and not errors:
        return recorded
    if code == EXIT_OK and not errors:
        # Only global rank 0 records the outcome; on the other nodes a clean exit is the outcome.
        run.write_status(state="completed", exit_code=EXIT_OK, ended=time.time(),
                         message="this node's ranks finished; events and checkpoints are on node 0")
        return EXIT_OK
    if errors:
        own = status.get("message") if state == "failed" else ""
        message = "; ".join(errors + ([f"rank 0: {own}"] if own else []))
    else:
        message = (f"the trainer exited with code {code} before finishing; last log lines:\n"
                   f"{run.tail_log(8)}")
    run.write_status(state="failed", message=message, ended=time.time(), exit_code=EXIT_FAILED)
    log.error("run failed: %s", message)
    return EXIT_FAILED


def _forward_signals(pids, stopping: threading.Event | None = None) -> None:
    """Stop requests to this launcher go on to its workers' launcher (torchrun) or the spawned ranks, once; `stopping`
    is set when one came."""
    def forward(why: str) -> None:
        if stopping is not None:
            stopping.set()
        for pid in pids():
            pass_stop_on(pid)

    on_stop(forward)


def _run_launcher(run: RunDir, cfg: RunConfig, resume: bool) -> int:
    """torchrun or horovodrun over the workers; waits, forwarding stop requests."""
    dev = cfg.device
    if dev.launcher == "horovod":
        cmd = horovodrun_command(cfg, run.path, resume)
    else:
        cmd = torchrun_command(cfg, run.path, resume, dev.master_port or free_port())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dev.nproc))),
               TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    log.info("launching: %s", " ".join(cmd))
    # The launcher gets its own session so that a stop sent to this process's group reaches it exactly once
    # (forwarded below); it then stops the workers, which it starts in sessions of their own.
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace", **detached(env, own_tree=False),
                            **ignoring_preempt_signal())
    stopping = threading.Event()
    _forward_signals(lambda: [proc.pid], stopping)
    tail: collections.deque[str] = collections.deque(maxlen=300)

    def pump():
        for line in proc.stderr:
            if stopping.is_set():  # torchrun's own SignalException traceback: the stop the user asked for, not an error
                log.debug("launcher after stop: %s", line.rstrip())
            else:
                sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    code = proc.wait()
    reader.join(timeout=5)
    if code != 0:
        _note_dead_rank(run, "".join(tail))
    return _worker_code(run, code)


def _note_dead_rank(run: RunDir, torchrun_output: str) -> None:
    """torchrun's failure summary names the first rank that died; record it when that rank could not."""
    m = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", torchrun_output, re.S)
    if m:
        run.note_dead_rank(int(m.group(1)), int(m.group(2)))


def _worker_code(run: RunDir, code: int) -> int:
    """The exit code rank 0 recorded (torchrun and spawn report only 'some worker failed')."""
    recorded = run.read_status().get("exit_code")
    return recorded if recorded is not None else (code if code >= 0 else EXIT_FAILED)


def _spawn_entry(index: int, run_dir: str, resume: bool, world: int, init_method: str) -> None:
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(world),
                      TRAINDECK_INIT_METHOD=init_method)
    code = run_worker(run_dir, resume)
    if code not in (EXIT_OK,):
        sys.exit(code)


def _spawn(run: RunDir, cfg: RunConfig, resume: bool) -> int:
    import torch.multiprocessing as mp

    dev = cfg.device
    if dev.init_method == "file":
        rendezvous = run.path / "rendezvous"
        rendezvous.unlink(missing_ok=True)
        init_method = f"file://{rendezvous}"
    else:
        init_method = f"tcp://127.0.0.1:{dev.master_port or free_port()}"
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dev.nproc)))
    try:
        context = mp.start_processes(_spawn_entry, args=(str(run.path), resume, dev.nproc, init_method),
                                     nprocs=dev.nproc, join=False, start_method="spawn")
        _forward_signals(lambda: [p.pid for p in context.processes if p.is_alive()])
        while not context.join():
            pass
    except mp.ProcessExitedException as e:
        if e.exit_code < 0 or e.exit_code not in (EXIT_BAD_INPUT, EXIT_DIVERGED):  # else a decision, not a death
            run.note_dead_rank(e.error_index, e.exit_code)
        return _worker_code(run, e.exit_code if e.exit_code > 0 else EXIT_FAILED)
    except mp.ProcessRaisedException:
        return _worker_code(run, EXIT_FAILED)
    return _worker_code(run, 0)
