"""The run lifecycle in the app: start, stop, resume, open or re-attach a run, and follow it.

Owns the trainer process and the RunModel of the run on show; the main window only shows what this says.
Command lines come from `trainer.runs.launch`, liveness and resumability from `trainer.core.rundir`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.jobs.background import CliJob
from app.jobs.run_model import RunModel
from app.jobs.trainer_process import TrainerProcess
from app.state.runs_folder import RunsFolder
from trainer.core.config import RunConfig, save_config
from trainer.core.errors import refusals
from trainer.core.files import atomic_write_text
from trainer.core.rundir import RESUMABLE_STATES, RunDir, list_runs, pending_folder, planned_run_dir, run_label
from trainer.core.summary import needs_building
from trainer.core.system import detached
from trainer.remote.mirror import MIRROR_LOG, mirror_pid, mirrors_dir
from trainer.runs import commands
from trainer.runs.commands import Auto, Summarize, Train
from trainer.runs.launch import (
    REPO_ROOT,
    main_command,
    resume_command,
)

log = logging.getLogger(__name__)

PREVIEW_POLL_MS = 500  # while a summary is built: how often the app looks for the part written so far
CATCH_UP_POLLS = 50  # when the trainer ends: polls (10 ms each at most) to read its last events
PROGRESS_MS = 200  # the status bar's progress and ETA are updated at most this often (a replay's events come by the
# thousand: QProgressBar.setValue per event took 1.3 s of a 10^6-step run's open, issue #72)
REMOTE_GRACE_MS = 120_000  # Stop of a run on a host: its follower escalates there itself (trainer/remote/mirror.py)


def refusal(output: Path, code: int) -> str:
    """Why the trainer refused to start: its `error:` lines (the rest of its output is in the app's log)."""
    try:
        text = output.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    if text.strip():
        log.info("trainer output before it refused:\n%s", text.strip())
    return refusals(text) or f"the trainer exited with code {code} before the run started"


class RunController(QObject):
    modelChanged = Signal(object)  # the RunModel now on show
    stateText = Signal(str)  # one line for the status bar
    progressed = Signal(float, int, object)  # epochs done (fractional), epochs, seconds left (or None)
    runFinished = Signal(str, str)  # final state, message
    changed = Signal()  # what can be done (start, stop, resume) may have changed

    def __init__(self, runs_folder: RunsFolder, parent: QObject | None = None):
        super().__init__(parent)
        self.runs_folder = runs_folder
        self.model: RunModel | None = None
        self.process = TrainerProcess(self)
        # a started run's config, output (and Auto's choices) until the trainer takes them
        self._pending: tuple[Path | None, Path, Path | None] | None = None
        self._stop_requested = False  # Stop was pressed for the process now running
        self.process.ended.connect(self._process_ended)
        self._followers: dict[Path, subprocess.Popen] = {}  # started by reattach_remote
        self._remote_status = QTimer(self)  # a run on a host before its first event: the host's or SLURM's word
        self._remote_status.setInterval(500)
        self._remote_status.timeout.connect(self._show_remote_status)
        self._remote_said = ""  # the host's or SLURM's word last shown
        self._latest_progress: dict | None = None  # the newest step or epoch not yet shown
        self._progress_timer = QTimer(self)  # the status bar's progress at most every PROGRESS_MS, not per event
        self._progress_timer.setSingleShot(True)
        self._progress_timer.setInterval(PROGRESS_MS)
        self._progress_timer.timeout.connect(self._show_progress)

    @property
    def runs_dir(self) -> Path:
        return self.runs_folder.path

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def finishing(self) -> bool:
        """The run on show has ended (its run_end is read) while its process is still exiting."""
        return self.running and self.model is not None and self.model.ended

    def can_resume(self) -> bool:
        return (not self.running and self.model is not None
                and self.model.run.effective_state() in RESUMABLE_STATES)

    def start(self, cfg: RunConfig, choices: list[dict] | None = None) -> RunDir:
        """A new run of `cfg` in a new run directory under the runs folder; `choices`: what Auto chose and why (kept
        in the run as auto.json).

        The trainer makes the directory (`trainer.runs.prepare`), after its pre-flight: until then the config and the
        output wait in the runs folder's `.pending/`, and a refused config leaves no run directory behind."""
        where = mirrors_dir(self.runs_dir, cfg.device.host) if cfg.device.host else self.runs_dir
        run = planned_run_dir(where, run_label(cfg.model.name))
        pending = pending_folder(self.runs_dir)
        pending.mkdir(parents=True, exist_ok=True)
        self._pending = (pending / f"{run.name}.yaml", pending / f"{run.name}.output.log",
                         pending / f"{run.name}.choices.json")
        save_config(cfg, self._pending[0])
        if choices is not None:
            atomic_write_text(self._pending[2], json.dumps({"choices": choices}))
        command = main_command(*Train(config=str(self._pending[0]), run_dir=str(run.path),
                                      output_log=str(self._pending[1]),
                                      auto_choices=str(self._pending[2]) if choices is not None else None).argv())
        self.process.grace_ms = REMOTE_GRACE_MS if cfg.device.host else self.process.default_grace_ms
        self._stop_requested = False
        self.process.start(command, self._pending[1], cwd=str(REPO_ROOT))
        self.watch(run, planned_epochs=cfg.train.epochs)
        return run

    def start_auto(self, folder: str, minutes: float, host: str, overrides: list[str],
                   labels: str | None = None) -> RunDir:
        """Auto on `host` as one trainer process, `main.py auto FOLDER --minutes N --host HOST` (as the trainer
        answered for a SLURM host: its plan is made inside the job; multi-label with `labels`, a labels file there);
        mirrored into a new folder under remote/HOST/."""
        run = planned_run_dir(mirrors_dir(self.runs_dir, host), run_label("auto"))
        pending = pending_folder(self.runs_dir)
        pending.mkdir(parents=True, exist_ok=True)
        output = pending / f"{run.name}.output.log"
        self._pending = (None, output, None)
        command = main_command(*Auto(folder=folder, minutes=minutes, host=host, run_dir=str(run.path),
                                     output_log=str(output), labels=labels, set=list(overrides)).argv())
        self.process.grace_ms = REMOTE_GRACE_MS
        self._stop_requested = False
        self.process.start(command, output, cwd=str(REPO_ROOT))
        self.watch(run)
        return run

    def stop(self) -> None:
        if self.running:
            self._stop_requested = True
            floor_s = self.process.grace_ms / 1000
            self.process.stop(int(1000 * (self.model.stop_grace_s(floor_s) if self.model is not None else floor_s)))
            self.stateText.emit("Stopping: saving a checkpoint…")
            self.changed.emit()

    def resume(self, run: RunDir) -> str | None:
        """Continue a stopped or failed run; why not, when it cannot be."""
        if self.running:
            return "a run is already going"
        state = run.effective_state()
        if state not in RESUMABLE_STATES:
            return f"{run.name} is {state}: only stopped or failed runs can be resumed."
        launched = time.time()
        self._start_for(run, resume_command(run.path))
        self._follow_segment(run, launched)
        return None

    def extend(self, run: RunDir, total_epochs: int) -> str | None:
        """Continue a completed (or early-stopped, stopped, failed) run up to `total_epochs`; why not, when it
        cannot be."""
        if self.running:
            return "a run is already going"
        state = run.effective_state()
        if state not in RESUMABLE_STATES + ("completed",):
            return f"{run.name} is {state}: only a completed, stopped or failed run can be continued."
        launched = time.time()
        self._start_for(run, resume_command(run.path, total_epochs))
        self._follow_segment(run, launched)
        return None

    def _follow_segment(self, run: RunDir, launched: float) -> None:
        """Follow the segment just launched on `run` to its end: on the dashboard already, or opened now (its
        earlier segments replayed without ending it here)."""
        if self.model is None or self.model.run.path != run.path:
            self.watch(run, segment_since=launched)
        else:
            self.model.expect_segment(launched)
            self.model.watch()
            self.changed.emit()
        self.stateText.emit(f"Resuming {run.name}: loading its last checkpoint…")

    def _start_for(self, run: RunDir, command: list[str]) -> None:
        """Start a command on an existing run: for a mirror its output goes to mirror.log (output.log is the
        host's), and Stop waits longer (the follower escalates there)."""
        remote = run.is_remote
        self._stop_requested = False
        self.process.grace_ms = REMOTE_GRACE_MS if remote else self.process.default_grace_ms
        self.process.start(command, run.path / MIRROR_LOG if remote else run.output_log, cwd=str(REPO_ROOT))

    def open(self, run: RunDir) -> None:
        """Show a past run (replayed from its events), re-attaching when it is still going (for a run on a host:
        to the process following it, started again when none is)."""
        self.watch(run)
        if self.running or not (run.is_live() or run.is_remote and run.awaits_requeue()):
            return
        if run.is_remote:
            started = self._followers.get(run.path)  # by reattach_remote, perhaps not yet holding the mirror's lock
            pid = mirror_pid(run) or (started.pid if started is not None and started.poll() is None else None)
            if pid is None:
                self._start_for(run, main_command(*commands.Mirror(run_dir=str(run.path)).argv()))
            else:
                self.process.grace_ms = REMOTE_GRACE_MS
                self.process.attach(pid)
        else:
            self.process.attach(run.read_status()["pid"])
        self.stateText.emit(f"Re-attached to {run.name}")

    def reattach_remote(self) -> list[RunDir]:
        """At start-up: a follower for every run on a host still going that nobody follows (the app was closed,
        the laptop rebooted), so their mirrors catch up whether or not they are opened."""
        started = []
        remote = self.runs_dir / "remote"  # only the mirrors are read (this runs at start-up, on the GUI thread)
        hosts = [p for p in remote.iterdir() if p.is_dir()] if remote.is_dir() else []
        for run in (r for folder in hosts for r in list_runs(folder)):
            if run.is_remote and (run.is_live() or run.awaits_requeue()) and mirror_pid(run) is None:
                with open(run.path / MIRROR_LOG, "ab") as out:
                    self._followers[run.path] = subprocess.Popen(
                        main_command(*commands.Mirror(run_dir=str(run.path)).argv()), stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), **detached(dict(os.environ, PYTHONUNBUFFERED="1")))
                started.append(run)
                log.info("following %s on its host again", run.name)
        return started

    def _show_remote_status(self) -> None:
        m = self.model
        requeued = m is not None and m.state == "preempted"  # its SLURM job pends again: SLURM's word until it runs
        if m is None or (m.start_event or m.ended) and not requeued:
            self._remote_status.stop()
            return
        message = m.run.read_status().get("message") if m.run.is_remote else None  # None: not submitted yet
        if message and message != self._remote_said:
            self._remote_said = message
            self.stateText.emit(f"{m.run.name}: {message}")

    def watch(self, run: RunDir, segment_since: float | None = None, planned_epochs: int = 0,
              build_summary: bool = True) -> None:
        """Show `run` on the dashboard and follow it; `segment_since`: a new segment of it was launched then;
        `planned_epochs`: what the status bar says a new run prepares for, until the trainer says more;
        `build_summary`: a long finished run without a summary has it built first (not again after it failed)."""
        if self.model is not None:
            self.model.close()
            self.model.deleteLater()
        model = self.model = RunModel(run, self)
        self._latest_progress = None  # the run shown before's
        if segment_since is not None:
            model.expect_segment(segment_since)
        model.stepLogged.connect(self._progress)
        model.epochEnded.connect(self._progress)
        model.runStarted.connect(self._started)
        model.runStarted.connect(lambda e: self._drop_pending_config())  # in the run directory now
        model.preparing.connect(lambda e: self.stateText.emit(f"Preparing {run.name}: {e['message']}…"))
        model.finished.connect(self._finished)
        self.modelChanged.emit(model)
        self.stateText.emit(f"Preparing {run.name}: scanning data, building the model…")
        if run.is_remote or run.path.parent.parent.name == "remote":
            self._remote_status.start()
        self.progressed.emit(0.0, planned_epochs, None)
        if build_summary and segment_since is None and needs_building(run.events) and not run.is_live():
            self._summarize_then_watch(model)
        else:
            model.watch()
        self.changed.emit()

    def _summarize_then_watch(self, model: RunModel) -> None:
        """A long finished run without a summary: built first by `main.py summarize` (a process of its own, one pass
        over the file), then read through it; the GUI thread never reads the whole file (issue #72)."""
        run = model.run
        size = run.events.stat().st_size / 2**20
        self.stateText.emit(f"Opening {run.name}: {size:.0f} MB of events without a summary; building it once…")
        job = CliJob(Summarize(run_dir=str(run.path)), self)
        preview = QTimer(self)  # what the summary holds so far (it writes it every PARTIAL_EVERY_S), shown meanwhile
        preview.setInterval(PREVIEW_POLL_MS)
        shown = []

        def show_so_far() -> None:
            if self.model is not model or shown:
                preview.stop()
            elif run.summary.exists():
                shown.append(True)
                preview.stop()
                model.reopen(summary_only=True)
                model.watch()

        def watch(why: str | None = None) -> None:
            preview.stop()
            if why:
                log.warning("%s: no summary built (%s): read whole", run.path, why)
            if self.model is not model:  # another run opened meanwhile
                return
            if shown:  # the summary so far is on the dashboard: the whole run, read by a model of its own
                self.watch(run, build_summary=False)
            else:
                model.reopen()
                model.watch()

        preview.timeout.connect(show_so_far)
        preview.start()
        job.done.connect(lambda answer: watch())
        job.failed.connect(watch)

    def _started(self, e: dict) -> None:
        """The status line at a segment's start: a resumed one says where it starts from."""
        name = self.model.run.name
        if self.model.awaiting_start:  # an earlier segment's start, replayed
            return
        self._latest_progress = None  # an earlier segment's
        self.progressed.emit(float(e.get("start_epoch") or 0), self.model.epochs or 1, None)  # no longer preparing
        if self.model.segments <= 1 and not e.get("start_step"):
            self.stateText.emit(f"Running {name}")
        elif e.get("resumed_from"):
            self.stateText.emit(f"Running {name}: resumed from epoch {e.get('start_epoch', 0)}, step "
                                f"{e.get('start_step', 0)} ({Path(e['resumed_from']).name})")
        else:
            self.stateText.emit(f"Running {name}: from the start (no checkpoint had been saved)")

    def _progress(self, e: dict) -> None:
        """A step or an epoch: shown within PROGRESS_MS, once for all that came meanwhile (a replay's thousands)."""
        self._latest_progress = e
        if not self._progress_timer.isActive():
            self._progress_timer.start()

    def _show_progress(self) -> None:
        m, e, self._latest_progress = self.model, self._latest_progress, None
        if m is not None and e is not None:
            self.progressed.emit(m.epochs_done(e), m.epochs or 1, m.eta_s)

    def _finished(self, state: str, message: str) -> None:
        self._progress_timer.stop()  # what it would show is the run's end now
        self._latest_progress = None
        self.stateText.emit(f"{self.model.run.name}: {state}" + (f" — {message}" if message else ""))
        self.runFinished.emit(state, message)
        self.changed.emit()
        if state == "preempted" and self.model.run.is_remote:
            self._remote_said = message  # said above
            self._remote_status.start()  # requeued, pending: SLURM's word, then the run's own again

    def _drop_pending_config(self) -> None:
        if self._pending is not None and self._pending[0] is not None:
            self._pending[0].unlink(missing_ok=True)

    def _process_ended(self, code: int) -> None:
        config, output, choices = self._pending or (None, None, None)
        self._pending = None
        if self.model is not None:
            for _ in range(CATCH_UP_POLLS):  # the events the process wrote last (small: its end)
                self.model.poll()
                if not self.model.catching_up:
                    break
            if output is not None and not self.model.run.path.exists():  # ended before a directory was made
                state, message = (("stopped", "stopped while the trainer was starting; nothing was trained")
                                  if self._stop_requested else ("failed", refusal(output, code)))
                self.model.finish(state, message)
                self.model.finished.emit(state, message)
                self._drop_pending(config, output, choices)
                return
            if self.process.forced and not self.model.ended:  # killed after Stop's grace: stopped, not crashed
                self.model.run.record_forced_stop(self.process.last_grace_ms / 1000)
            if self.model.launch_ended(code) or self.model.check_process():  # ended here without a run_end
                self.model.finished.emit(self.model.state, self.model.message)
        self._drop_pending(config, output, choices)

    def _drop_pending(self, *paths: Path | None) -> None:
        for path in paths:
            if path is not None:
                path.unlink(missing_ok=True)
        self.changed.emit()

    def shutdown(self) -> None:
        """Stop following (the trainer itself is left alone) and let the standby trainer go."""
        if self.model is not None:
            self.model.close()
        self.process.detach()
        self.process.close_standby()
