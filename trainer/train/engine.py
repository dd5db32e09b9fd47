"""One training process: `run_worker(run_dir)` trains the run in that directory on this rank.

It sets up logging and the stop signal, builds the parts (`parts.build`), runs the loop (`loop.Loop`) and,
whatever happens, records how the run ended: exit code, status.json and the last events. Input errors
(config, data, model) end with their message alone on the console; tracebacks go to train.log only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable

import numpy as np
import torch

from trainer.core import clock
from trainer.core.config import ConfigError, RunConfig, config_from, read_config_file, save_config
from trainer.core.errors import InputError
from trainer.core.rundir import EXIT_PREEMPTED, RunDir, RunDirDeleted
from trainer.core.system import PREEMPT_SIGNAL, on_stop, preempt_signalled
from trainer.data.cache import Interrupted
from trainer.deploy.finish import finish_run
from trainer.device.mps import reporting_fallbacks
from trainer.device.strategy import LaunchError, Strategy, make_strategy
from trainer.model.checkpoint import CheckpointWriteError, TrainState, describe_write_failure
from trainer.train.loop import Diverged, Loop
from trainer.train.optim import merged_groups
from trainer.train.parts import Parts, build
from trainer.train.reporter import Reporter, reporter_for

log = logging.getLogger("trainer")
trace_log = logging.getLogger("trainer.trace")  # tracebacks: to train.log only, never to the console
trace_log.setLevel(logging.DEBUG)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3
ELASTIC_RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun's count of its restarts of the ranks
REQUEUE_ENV = "SLURM_RESTART_COUNT"  # set by SLURM in a job it started again (requeued): the times it did


class StopRequest:
    """Set when this process is asked to stop (trainer/core/system.py's stop channel: SIGTERM or SIGINT, the run's
    stop file, a launched worker's launcher gone); the loop stops at the next safe point and checkpoints. SLURM's
    warning signal (PREEMPT_SIGNAL) stops it the same way and marks the run `preempted`: its job requeues itself."""

    def __init__(self):
        self.requested = False
        self.preempted = False

    def install(self, watch_parent: bool = False) -> Callable[[], None]:
        def handler(why: str) -> None:
            if not self.requested:
                log.info("%s: stopping after the current step", why if why.startswith("the ") else f"received {why}")
            self.requested = True

        def preempt(signum, frame) -> None:
            if not self.preempted:
                log.info("received %s (SLURM: the job's time limit or a preemption is near): checkpointing after "
                         "the current step; the job requeues itself", PREEMPT_SIGNAL)
            self.preempted = self.requested = True

        undo = on_stop(handler, watch_parent)
        if not hasattr(signal, PREEMPT_SIGNAL):  # Windows: no SLURM there
            return undo
        previous = signal.signal(getattr(signal, PREEMPT_SIGNAL), preempt)
        if preempt_signalled():  # it came while this process was starting
            preempt(None, None)

        def undo_both() -> None:
            undo()
            signal.signal(getattr(signal, PREEMPT_SIGNAL), previous)

        return undo_both


def fallbacks_reported(device: torch.device, reporter: Reporter):
    """On Apple's GPU, each operation it runs on the CPU instead, said once as a warning of the run."""
    if device.type != "mps":
        return contextlib.nullcontext()

    def report(operator: str, message: str) -> None:
        log.warning("%s", message)
        reporter.warning("mps_fallback", message, operator=operator)

    return reporting_fallbacks(report)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_logging(run: RunDir, rank: int) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(f"%(asctime)s {'' if rank == 0 else f'[rank {rank}] '}%(levelname)s %(message)s",
                            "%H:%M:%S")
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(fmt)
    stderr.setLevel(logging.INFO)
    root.addHandler(stderr)
    if rank == 0:
        file_handler = logging.FileHandler(run.log, encoding="utf-8")
        file_handler.setFormatter(fmt)
        file_handler.setLevel(logging.DEBUG)  # also the tracebacks of trace_log
        root.addHandler(file_handler)


def describe_failure(exc: BaseException, run: RunDir) -> str:
    """A one-line reason for a failed run, with a hint for the failures users can fix."""
    if isinstance(exc, (InputError, RunDirDeleted)):
        return str(exc)
    if not run.path.is_dir():
        return f"the run directory {run.path} was deleted while the run was going; nothing more could be saved"
    text = f"{type(exc).__name__}: {exc}".strip()
    oom = isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc)
    if oom:
        return (f"out of memory ({text.splitlines()[0][:200]}); try a smaller data.batch_size, a smaller "
                f"data.image_size or train.amp bf16/fp16")
    if isinstance(exc, OSError):
        return str(exc) if isinstance(exc, CheckpointWriteError) else describe_write_failure(exc, run.path)
    return text.splitlines()[0][:500] if text else type(exc).__name__


def run_worker(run_dir: str, resume: bool = False) -> int:
    """Train the run in `run_dir` on this rank; returns the process exit code."""
    started = clock.now()  # train.budget counts from here
    run = RunDir(run_dir)
    restarted = int(os.environ.get(ELASTIC_RESTART_ENV) or 0)  # torchrun started the ranks again: from the checkpoint
    resume = resume or restarted > 0
    # torchrun, spawn and horovodrun workers must not outlive their launcher
    stop = StopRequest()
    stop.install(watch_parent="RANK" in os.environ or "HOROVOD_RANK" in os.environ)
    try:
        cfg, strategy = config_and_strategy(run, resume)
    except (ConfigError, LaunchError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    setup_logging(run, strategy.rank)
    reporter = reporter_for(run.events, strategy.is_main, cfg.monitor.system_every_s, strategy.sample_gpus,
                            tensorboard=cfg.monitor.tensorboard, mlflow=cfg.monitor.mlflow,
                            mlflow_experiment=cfg.monitor.mlflow_experiment,
                            launcher_pid=run.read_status().get("pid") if strategy.is_main else None)
    loop: Loop | None = None
    state, message, code = "failed", "", EXIT_FAILED
    try:
        if strategy.is_main:
            run.write_status(state="running", message="", worker_pid=os.getpid())
        seed_everything(cfg.train.seed + strategy.rank)
        parts = build(cfg, strategy, reporter, should_stop=lambda: stop.requested)
        loop = Loop(run, cfg, strategy, parts, reporter, stop, started=started)
        resumed_from = loop.resume() if resume else None
        strategy.broadcast_initial_state(parts.net, parts.optimizer)
        if strategy.is_main and parts.augment_choices:  # config.yaml: what auto became (run_start says why), so a
            save_config(cfg, run.config)  # resume, a comparison or a copy of the run trains with the same decisions
        announce(reporter, cfg, strategy, parts, loop.state, resumed_from, loop.checkpoint_writer.background)
        if strategy.is_main:
            announce_restart(reporter, run, restarted, resumed_from, loop.state.step)
        with fallbacks_reported(strategy.device, reporter):
            state = loop.fit()
        loop.checkpoint_writer.wait()  # written and durable before the run reports itself stopped or finished
        strategy.leave_together()
        # the run's end is the deploy package's: test set, exports (not for a run that made way for another network)
        if state == "completed" and strategy.is_main and not loop.plan.made_way:
            with loop.threads_fitted():
                finish_run(run, reporter, parts.data.test, cfg)
        code, message = EXIT_OK, ending_message(state, loop, cfg)
        if state == "stopped" and stop.preempted:
            state, code = "preempted", EXIT_PREEMPTED
            message = (f"preempted at epoch {loop.state.epoch + 1}, step {loop.state.step} (SLURM's warning signal): "
                       f"checkpointed; the requeued job goes on from there")
    except Exception as e:  # noqa: BLE001 - every failure is reported, never silent
        state, message, code = failure_of(e, run, reporter, strategy, loop, stop)
    finally:
        record_end(run, reporter, strategy, loop, state, message, code)
    return code


def config_and_strategy(run: RunDir, resume: bool) -> tuple[RunConfig, Strategy]:
    """The run's config (a resumed older run's recipe kept) and this rank's strategy."""
    raw = read_config_file(run.config)
    cfg = config_from(raw, run.config)
    if resume:
        keep_recipe_of_older_runs(cfg, raw)
    return cfg, make_strategy(cfg)


def failure_of(exc: Exception, run: RunDir, reporter: Reporter, strategy: Strategy, loop: Loop | None,
               stop: StopRequest) -> tuple[str, str, int]:
    """(state, message, exit code) of a run that ended by `exc`: stopped or preempted before its first step,
    diverged, or failed (a refusal of input or anything else), said in its log and its events."""
    if isinstance(exc, Interrupted):
        state, code = ("preempted", EXIT_PREEMPTED) if stop.preempted else ("stopped", EXIT_OK)
        message = (f"{'preempted' if stop.preempted else 'stopped by request'} while preparing, before the first "
                   f"step; start it again to continue")
        log.info("%s", message)
        return state, message, code
    if isinstance(exc, Diverged):
        log.error("%s", exc)
        _emit_safely(reporter, "error", kind="diverged", message=str(exc), rank=strategy.rank,
                     step=loop.state.step if loop else 0)
        return "diverged", str(exc), EXIT_DIVERGED
    code = EXIT_BAD_INPUT if isinstance(exc, InputError) else EXIT_FAILED
    message = describe_failure(exc, run) + restart_note()
    log.error("run failed: %s%s", message, "" if code == EXIT_BAD_INPUT else f" (traceback in {run.log})")
    trace_log.debug("%s", traceback.format_exc())
    _emit_safely(reporter, "error", kind=type(exc).__name__, message=message, rank=strategy.rank,
                 traceback=traceback.format_exc()[-4000:])
    run.write_rank_error(strategy.rank, message)
    return "failed", message, code


def record_end(run: RunDir, reporter: Reporter, strategy: Strategy, loop: Loop | None, state: str, message: str,
               code: int) -> None:
    """How the run ended, whatever happened: its last checkpoint made durable, the `run_end` event, status.json, and
    the reporter and strategy closed."""
    if loop is not None:
        try:
            loop.checkpoint_writer.close()
        except OSError as e:
            log.error("the last checkpoint may not be durable: %s", e)
    progress = loop.state if loop is not None else TrainState()
    best = progress.best_acc if progress.best_acc >= 0 else None
    ending = loop.plan.end_reason(loop.state) if loop is not None and state == "completed" else {}
    _emit_safely(reporter, "run_end", status=state, message=message, best_acc=best,
                 epochs_completed=progress.epoch, step=progress.step, **ending)
    if strategy.is_main:
        try:
            run.write_status(state=state, message=message, best_acc=best, ended=clock.now(), exit_code=code,
                             reason=ending.get("reason"), fit_epochs=ending.get("fit_epochs"))
        except OSError as e:
            log.error("cannot record the run's end in %s: %s", run.status_file, e)
    try:
        reporter.close()
    except OSError:
        pass
    strategy.shutdown()
    if strategy.is_main:
        log.info("run %s: %s%s", run.name, state, f" ({message})" if message else "")


def restart_note() -> str:
    """What follows a rank's failure under torchrun with restarts left (device.max_restarts): said in its message."""
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) - int(os.environ.get(ELASTIC_RESTART_ENV) or 0)
    return f"; torchrun starts the ranks again from the last checkpoint ({left} restart(s) left)" if left > 0 else ""


def announce_restart(reporter: Reporter, run: RunDir, elastic: int, resumed_from: str | None, step: int) -> None:
    """The `restart` event, once per restart: torchrun started the ranks again after one died (`elastic`, its count),
    or SLURM requeued the job (status.json's `requeues`, recorded by the launcher as it started)."""
    status = run.read_status()
    if elastic:
        by, count, lost = "torchrun", elastic, None
    elif os.environ.get(REQUEUE_ENV) and status.get("requeues"):
        by, count, lost = "slurm", status["requeues"], status.get("requeue_lost_s")
    else:
        return
    message = (f"{'torchrun started the ranks again after one ended' if by == 'torchrun' else 'SLURM requeued the job'}"
               f" (restart {count}): going on from {resumed_from or 'the start (no checkpoint yet)'} at step {step}")
    log.info("%s", message)
    reporter.emit("restart", by=by, count=count, step=step, checkpoint=resumed_from, lost_s=lost, message=message)


def keep_recipe_of_older_runs(cfg: RunConfig, raw: dict) -> None:
    """A run started before optimizer.norm_weight_decay existed (its saved config, `raw`, has no such key) decayed
    every parameter alike (and its optimizer state has no no-decay groups): resumed, it goes on that way."""
    if "norm_weight_decay" not in (raw.get("optimizer") or {}):
        cfg.optimizer.norm_weight_decay = None


def announce(reporter: Reporter, cfg: RunConfig, strategy: Strategy, parts: Parts, state: TrainState,
             resumed_from: str | None, background_checkpoints: bool) -> None:
    """The run_start event (what the app's dashboard and summary show) and its log line."""
    net = parts.net
    reporter.emit(
        "run_start", config=cfg.to_dict(), classes=parts.classes, train_size=len(parts.data.train),
        val_size=len(parts.data.val), world_size=strategy.world_size, device=strategy.description,
        cache=parts.data.cache, workers=parts.workers, steps_per_epoch=parts.steps_per_epoch,
        precision=parts.precision.amp, precision_reason=parts.precision_reason,
        memory_format=str(parts.memory_format).removeprefix("torch."), compiled=cfg.train.compile,
        param_groups=merged_groups(parts.groups),
        parameters=sum(p.numel() for p in net.parameters()),
        trainable=sum(p.numel() for p in net.parameters() if p.requires_grad),
        layers=parts.monitor.names, resumed_from=resumed_from, start_epoch=state.epoch, start_step=state.step,
        weights=parts.weights, mean=parts.mean, std=parts.std, normalisation=parts.normalisation_source,
        head=parts.head, manifest=parts.data.manifest, augment=parts.augment_choices,
        checkpoint_writer="background" if background_checkpoints else "sync",
        frozen={"backbone": parts.linear_probe, "until_epoch": parts.unfreeze_at_epoch})
    if strategy.is_main:
        if parts.data.manifest:
            log.info("manifest %s: %d images left out, %d relabelled, %d added", parts.data.manifest["file"],
                     parts.data.manifest["excluded"], parts.data.manifest["relabelled"], parts.data.manifest["added"])
        for choice in parts.augment_choices:
            log.info("%s: auto -> %s (%s)", choice["key"], choice["value"], choice["why"])
        if parts.weights:
            log.info("weights: %s (%s, sha256 %s); normalisation from %s", parts.weights.get("name") or "local file",
                     parts.weights.get("file"), (parts.weights.get("sha256") or "-")[:16], parts.normalisation_source)
        log.info("training %s on %d images (%d classes), validating on %d; %s; %s (%s); cache %s; %d workers",
                 cfg.model.name, len(parts.data.train), len(parts.classes), len(parts.data.val),
                 strategy.description, parts.precision.amp, parts.precision_reason, parts.data.cache, parts.workers)


def ending_message(state: str, loop: Loop, cfg) -> str:
    """Why a run that ended well ended: stopped, its budget spent, or stopped improving."""
    plan = loop.plan
    if plan.made_way:
        return f"{plan.made_way['why']}: ended after its first epoch, not tested or exported"
    if plan.out_of_budget:
        return (f"train.budget of {cfg.train.budget:g} min spent after {loop.state.epoch} epochs (continue it "
                f"with `main.py resume RUN_DIR --epochs N`)")
    if loop.state.early_stopped or plan.annealing_to_stop:
        annealed = " and the learning rate annealed" if plan.annealing_to_stop else ""
        return (f"early stop at epoch {loop.state.epoch}: {cfg.train.early_stop.metric} stopped improving{annealed} "
                f"(continue it with `main.py resume RUN_DIR --epochs N`)")
    return "stopped by request; resume to continue" if state == "stopped" else ""


def _emit_safely(reporter: Reporter, event: str, **fields) -> None:
    """An event at the end of a run that may have failed because nothing can be written any more."""
    try:
        reporter.emit(event, **fields)
    except (OSError, ValueError) as e:
        log.error("cannot write the %s event: %s", event, e)
