"""The one way a run directory comes to be: pre-flight first, then the directory, its lock, the resolved config
and the frozen `data.exclude` manifest.

`main.py train` (and through it the app's Start), `main.py queue add` and sweeps all call `prepare_run`, so a
refused input leaves no directory whoever asked, and every run keeps the manifest it trained with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer.core.config import ConfigError, RunConfig, save_config
from trainer.core.errors import InputError
from trainer.core.files import atomic_write_text
from trainer.core.rundir import RunDir, RunDirUsed, new_run_dir, run_label


def prepare_run(cfg: RunConfig, *, runs_dir: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None,
                label: str | None = None, overwrite: bool = False, checked: bool = False,
                output_log: str | os.PathLike | None = None, choices: list[dict] | None = None):
    """(run, lock): a run directory ready to launch `cfg`, its lock held (close it, or hand it to `launch`).

    `run_dir` names the directory (it may exist: an empty one, or with `overwrite` one holding a run, which is
    cleared); else a new one is made under `runs_dir` with `label` (default: the model's). `checked`: the caller
    has already run the pre-flight on `cfg` (a sweep checks all its trials before queueing any). `output_log` is
    the file this process's output already goes to (the app's launch): it is moved in as the run's output.log.
    `choices`: what Auto chose and why, kept as the run's auto.json.
    Raises the input error (exit 2) before anything is made.
    """
    from trainer.data.manifest import read_manifest, write_manifest
    from trainer.train.preflight import preflight

    if not checked:
        preflight(cfg)
    manifest = read_manifest(cfg.data.exclude) if cfg.data.exclude else None  # before an --overwrite clears
    for where, key in ((run_dir, "--run-dir"), (runs_dir, "--runs-dir")):
        if where is not None:
            check_folder_names(where, key)  # before any folder of it is made: a refusal leaves none behind
    run = RunDir(run_dir) if run_dir is not None else new_run_dir(runs_dir, label or run_label(cfg.model.name))
    lock = run.lock()  # held from before the first write until the run ends: two launches never mix
    try:
        if run.holds_a_run():
            if not overwrite:
                raise RunDirUsed(f"{run.path}: already holds a run ({run.effective_state()}); continue it with "
                                 f"`main.py resume {run.path}`, train into a new directory, or pass --overwrite "
                                 f"to replace it")
            run.clear_for_new_run()
        run.create()
        if output_log is not None and Path(output_log).exists():
            os.replace(output_log, run.output_log)  # our own output keeps going to it (same file, new name)
        if manifest is not None:  # the run keeps the manifest it trained with: later edits do not change it
            cfg.data.exclude = str(write_manifest(manifest, run.manifest))
        save_config(cfg, run.config)
        if choices is not None:
            atomic_write_text(run.auto_choices, json.dumps({"choices": choices}, indent=1))
    except BaseException:
        lock.close()
        raise
    return run, lock


def check_folder_names(path: str | os.PathLike, key: str) -> None:
    """Every folder name of `path` fits this file system (InputError naming `key` otherwise)."""
    longest = max(Path(path).absolute().parts, key=lambda part: len(os.fsencode(part)))
    try:
        limit = os.pathconf(Path(path).absolute().anchor, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):
        limit = 255
    if len(os.fsencode(longest)) > limit:
        raise InputError(f"{key}: a folder name of {len(os.fsencode(longest))} bytes ({longest[:40]}...); this file "
                         f"system takes at most {limit}")


def choices_lines(choices: list[dict]) -> list[str]:
    """Auto's choices as `main.py auto` prints them: key, value, why, in columns."""
    width = max((len(c["key"]) for c in choices), default=0)
    return [f"{c['key']:<{width}}  {c['value']!s:<14}  {c['why']}" for c in choices]


def extend_run(run: RunDir, cfg: RunConfig, status: dict, total: int) -> str | None:
    """Raise the run's train.epochs to `total` (its config.yaml, atomically); what the schedule does then."""
    from trainer.core.schedule import describe_extension

    done = int(status.get("epoch") or 0)
    if total <= done:
        raise ConfigError([f"--epochs: the run has trained {done} epochs; give a larger total, such as {done + 5}"])
    steps = run.last_events("run_start").get("run_start", {}).get("steps_per_epoch")
    cfg.train.epochs = total
    budget = ""
    if cfg.train.budget:  # the epochs given are the rule now: the time budget was the first segments'
        budget = (f"train.budget ({cfg.train.budget:g} min) was the run's until now: epochs {done + 1} to {total} "
                  f"added train without one")
        cfg.train.budget, cfg.train.replan = 0.0, False
    save_config(cfg, run.config)
    notes = [budget, describe_extension(cfg.scheduler, cfg.optimizer.lr, done, total, steps) if steps else ""]
    return "; ".join(n for n in notes if n) or None
