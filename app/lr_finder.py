"""The learning-rate finder from the app: `main.py lr-find` on the current form, in a subprocess."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.background import CliJob
from trainer.core.config import RunConfig, save_config


class LrFinder(QObject):
    done = Signal(dict)  # the sweep: lrs, losses, suggested_lr, ...
    failed = Signal(str)

    def __init__(self, runs_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.runs_dir = Path(runs_dir)
        self.job: CliJob | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def start(self, cfg: RunConfig) -> None:
        if self.busy:
            return
        folder = self.runs_dir / "configs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"lr-find-{time.strftime('%Y%m%d-%H%M%S')}.yaml"
        save_config(cfg, path)
        self.job = CliJob(["lr-find", str(path), "--json"], self)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)

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
