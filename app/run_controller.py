"""The run lifecycle in the app: start, stop, resume, open or re-attach a run, and follow it.

Owns the trainer process and the RunModel of the run on show; the main window only shows what this says.
Command lines come from `trainer.launch`, liveness and resumability from `trainer.rundir`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.run_model import RunModel
from app.trainer_process import TrainerProcess
from trainer.config import RunConfig, save_config
from trainer.launch import REPO_ROOT, resume_command, train_command
from trainer.rundir import RESUMABLE_STATES, RunDir, planned_run_dir, run_label

log = logging.getLogger(__name__)

PENDING = ".pending"  # under the runs folder: what a started run waits in until the trainer makes its directory


def refusal(output: Path, code: int) -> str:
    """Why the trainer refused to start: its `error:` lines (the rest of its output is in the app's log)."""
    try:
        text = output.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    errors = [line.removeprefix("error: ") for line in text.splitlines() if line.startswith("error: ")]
    if text.strip():
        log.info("trainer output before it refused:\n%s", text.strip())
    return "; ".join(errors) or f"the trainer exited with code {code} before the run started"


class RunController(QObject):
    modelChanged = Signal(object)  # the RunModel now on show
    stateText = Signal(str)  # one line for the status bar
    progressed = Signal(float, int, object)  # epochs done (fractional), epochs, seconds left (or None)
    runFinished = Signal(str, str)  # final state, message
    changed = Signal()  # what can be done (start, stop, resume) may have changed

    def __init__(self, runs_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.runs_dir = Path(runs_dir)
        self.model: RunModel | None = None
        self.process = TrainerProcess(self)
        self._pending: tuple[Path, Path] | None = None  # a started run's config and output until the trainer takes them
        self.process.ended.connect(self._process_ended)

    @property
    def running(self) -> bool:
        return self.process.running

    def can_resume(self) -> bool:
        return (not self.running and self.model is not None
                and self.model.run.effective_state() in RESUMABLE_STATES)

    def start(self, cfg: RunConfig) -> RunDir:
        """A new run of `cfg` in a new run directory under the runs folder.

        The trainer makes the directory (`trainer.prepare`), after its pre-flight: until then the config and the
        output wait in the runs folder's `.pending/`, and a refused config leaves no run directory behind."""
        run = planned_run_dir(self.runs_dir, run_label(cfg.model.name))
        pending = self.runs_dir / PENDING
        pending.mkdir(parents=True, exist_ok=True)
        self._pending = (pending / f"{run.name}.yaml", pending / f"{run.name}.output.log")
        save_config(cfg, self._pending[0])
        command = train_command(self._pending[0], run_dir=run.path) + ["--output-log", str(self._pending[1])]
        self.process.start(command, self._pending[1], cwd=str(REPO_ROOT))
        self.watch(run)
        return run

    def stop(self) -> None:
        if self.running:
            self.process.stop()
            self.stateText.emit("Stopping: saving a checkpoint…")
            self.changed.emit()

    def resume(self, run: RunDir) -> str | None:
        """Continue a stopped or failed run; why not, when it cannot be."""
        if self.running:
            return "a run is already going"
        state = run.effective_state()
        if state not in RESUMABLE_STATES:
            return f"{run.name} is {state}: only stopped or failed runs can be resumed."
        self.process.start(resume_command(run.path), run.output_log, cwd=str(REPO_ROOT))
        if self.model is None or self.model.run.path != run.path:
            self.watch(run)
        else:
            self.model.watch()
            self.changed.emit()
        return None

    def extend(self, run: RunDir, total_epochs: int) -> str | None:
        """Continue a completed (or early-stopped, stopped, failed) run up to `total_epochs`; why not, when it
        cannot be."""
        if self.running:
            return "a run is already going"
        state = run.effective_state()
        if state not in RESUMABLE_STATES + ("completed",):
            return f"{run.name} is {state}: only a completed, stopped or failed run can be continued."
        self.process.start(resume_command(run.path, total_epochs), run.output_log, cwd=str(REPO_ROOT))
        if self.model is None or self.model.run.path != run.path:
            self.watch(run)
        else:
            self.model.watch()
            self.changed.emit()
        return None

    def open(self, run: RunDir) -> None:
        """Show a past run (replayed from its events), re-attaching when it is still going."""
        self.watch(run)
        if run.is_live() and not self.running:
            self.process.attach(run.read_status()["pid"])
            self.stateText.emit(f"Re-attached to {run.name}")

    def watch(self, run: RunDir) -> None:
        if self.model is not None:
            self.model.close()
            self.model.deleteLater()
        model = self.model = RunModel(run, self)
        model.stepLogged.connect(self._progress)
        model.epochEnded.connect(self._progress)
        model.runStarted.connect(lambda e: self.stateText.emit(f"Running {run.name}"))
        model.runStarted.connect(lambda e: self._drop_pending_config())  # in the run directory now
        model.preparing.connect(lambda e: self.stateText.emit(f"Preparing {run.name}: {e['message']}…"))
        model.finished.connect(self._finished)
        self.modelChanged.emit(model)
        self.stateText.emit(f"Preparing {run.name}: scanning data, building the model…")
        self.progressed.emit(0.0, 0, None)
        model.watch()
        self.changed.emit()

    def _progress(self, e: dict) -> None:
        m = self.model
        self.progressed.emit(m.epochs_done(e), m.epochs or 1, m.eta_s)

    def _finished(self, state: str, message: str) -> None:
        self.stateText.emit(f"{self.model.run.name}: {state}" + (f" — {message}" if message else ""))
        self.runFinished.emit(state, message)
        self.changed.emit()

    def _drop_pending_config(self) -> None:
        if self._pending is not None:
            self._pending[0].unlink(missing_ok=True)

    def _process_ended(self, code: int) -> None:
        config, output = self._pending or (None, None)
        self._pending = None
        if self.model is not None:
            self.model.poll()
            if output is not None and not self.model.run.path.exists():  # refused before a directory was made
                message = refusal(output, code)
                self.model.finish("failed", message)
                self.model.finished.emit("failed", message)
        for path in (config, output):
            if path is not None:
                path.unlink(missing_ok=True)
        self.changed.emit()

    def shutdown(self) -> None:
        """Stop following (the trainer itself is left alone) and let the standby trainer go."""
        if self.model is not None:
            self.model.close()
        self.process.detach()
        self.process.close_standby()
