"""The learning-rate finder from the app: `main.py lr-find` on the current form (the resident worker answers it when
it is up), its points as they are measured, then the whole sweep."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.jobs.background import CliJob
from app.state.runs_folder import RunsFolder
from trainer.core.config import RunConfig, save_config
from trainer.core.events import LR_POINT
from trainer.core.rundir import new_config_file
from trainer.runs.commands import LrFind


class LrFinder(QObject):
    done = Signal(dict)  # the sweep: lrs, losses, suggested_lr, ...
    failed = Signal(str)
    point = Signal(float, float)  # a step measured: learning rate, smoothed loss

    def __init__(self, runs_folder: RunsFolder, parent: QObject | None = None):
        super().__init__(parent)
        self.runs_folder = runs_folder
        self.job: CliJob | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def start(self, cfg: RunConfig, lr_range: tuple[float, float] | None = None) -> None:
        """Sweep on `cfg`, over the trainer's default range or `lr_range` (what a sweep without a minimum offered)."""
        if self.busy:
            return
        path = new_config_file(self.runs_folder.path, "lr-find")
        save_config(cfg, path)
        span = {"start": lr_range[0], "end": lr_range[1]} if lr_range else {}
        self.job = CliJob(LrFind(config=str(path), json=True, **span), self)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)
        self.job.progress.connect(self._progress)

    def _progress(self, line: str) -> None:
        if line.startswith(LR_POINT):
            try:
                lr, loss = (float(x) for x in line.removeprefix(LR_POINT).split())
            except ValueError:
                return
            self.point.emit(lr, loss)

    def _done(self, result: dict) -> None:
        self.job = None
        self.done.emit(result)

    def _failed(self, error: str) -> None:
        self.job = None
        self.failed.emit(error)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None
