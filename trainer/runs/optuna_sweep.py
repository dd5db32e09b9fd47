"""`method: optuna` sweeps: TPE proposes each trial's values, the median pruner stops weak trials part-way.

Each trial is an ordinary queued run (tagged with its sweep, run by the queue's scheduler, which is started when
none is running). This process follows the trial's events: every epoch's metric is reported to Optuna, and a trial
the pruner stops is stopped like any run (SIGTERM: it checkpoints and ends) and recorded as `stopped` with the
reason `pruned`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trainer.core.events import EventTail
from trainer.core.rundir import FINAL_STATES, RunDir
from trainer.core.system import detached, pid_alive, stop_tree
from trainer.runs import queue
from trainer.runs.sweep import Sweep, SweepError

POLL_S = 0.5
STARTUP_TRIALS = 2  # trials that always run to the end before the pruner compares against their median


def run_study(sweep: Sweep, runs_dir: Path, log=lambda m: print(m, file=sys.stderr, flush=True)) -> int:
    try:
        import optuna
    except ImportError as e:
        raise SweepError("method optuna needs the optuna package; install it with pip install -e '.[sweeps]'") from e
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    maximise = sweep.metric == "val_acc"
    study = optuna.create_study(direction="maximize" if maximise else "minimize",
                                sampler=optuna.samplers.TPESampler(seed=sweep.seed),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS, n_warmup_steps=0))
    for number in range(sweep.trials):
        trial = study.ask()
        values = {k: (trial.suggest_int(k, int(s["low"]), int(s["high"]), log=s["log"]) if sweep._is_int(k)
                      else trial.suggest_float(k, s["low"], s["high"], log=s["log"])) for k, s in sweep.random.items()}
        run = queue.add(runs_dir, sweep.config(values), label=f"{sweep.name}-{number + 1:03d}", sweep=sweep.name,
                        values=values)
        print(run.path, flush=True)
        ensure_scheduler(runs_dir)
        value, pruned_at = follow(run, trial, sweep.metric)
        if pruned_at is not None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log(f"{run.name}: pruned at epoch {pruned_at}")
        elif value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log(f"{run.name}: {run.read_status().get('state')} without a {sweep.metric}")
        else:
            study.tell(trial, value)
            log(f"{run.name}: {sweep.metric} {value:.4g}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if done:
        log(f"best {sweep.metric} {study.best_value:.4g} with {study.best_params}")
    return 0


def ensure_scheduler(runs_dir: Path) -> None:
    """Start the queue's scheduler when none is running (it outlives this process)."""
    from trainer.runs.commands import Queue
    from trainer.runs.launch import main_command

    if not queue.live_schedulers(runs_dir):
        subprocess.Popen(main_command(*Queue(action="run", runs_dir=str(runs_dir), until_empty=True).argv()),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **detached())
        deadline = time.time() + 30
        while not queue.live_schedulers(runs_dir) and time.time() < deadline:
            time.sleep(0.1)


def follow(run: RunDir, trial, metric: str) -> tuple[float | None, int | None]:
    """Report each epoch's metric to the trial until the run ends; (last value, epoch it was pruned at or None)."""
    tail = EventTail(run.events)
    last, reported = None, 0
    while True:
        for e in tail.read_new():
            if e.get("event") == "epoch" and e.get(metric) is not None and e["epoch"] > reported:
                reported, last = e["epoch"], e[metric]
                trial.report(last, reported)
                if trial.should_prune() and run.read_status().get("state") not in FINAL_STATES:
                    stop_run(run)
                    if run.read_status().get("state") == "stopped":  # not when it finished meanwhile
                        run.write_status(reason="pruned", message=f"pruned by the sweep at epoch {reported} (its "
                                         f"{metric} was below the median of earlier trials)")
                        return last, reported
        status = run.read_status()
        if status.get("state") in FINAL_STATES and not run.is_live():
            for e in tail.read_new():
                if e.get("event") == "epoch" and e.get(metric) is not None:
                    last = e[metric]
            return (last if status["state"] == "completed" else None), None
        time.sleep(POLL_S)


def stop_run(run: RunDir, timeout: float = 120) -> None:
    """Stop a live run as Stop does (it checkpoints and ends) and wait for it."""
    status = run.read_status()
    pgid, pid = status.get("pgid"), status.get("pid")
    if not (pgid or pid) or not stop_tree(pgid or pid):
        return
    deadline = time.time() + timeout
    while (run.is_live() or pid_alive(pid)) and time.time() < deadline:  # gone, its last status written
        time.sleep(0.2)
