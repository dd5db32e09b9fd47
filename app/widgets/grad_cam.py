"""Grad-CAM on demand: `main.py grad-cam` for one image of a run (the resident worker answers it when it is up),
the overlay written to a temporary folder the asker owns. The Results tab and the multi-label view both ask it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.jobs.background import CliJob
from trainer.runs import commands


class GradCam(QObject):
    done = Signal(str, dict)  # the image asked about, the trainer's answer (overlay, explained, ...)
    failed = Signal(str, str)  # the image, the error

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.job: CliJob | None = None
        self._folder: tempfile.TemporaryDirectory | None = None  # made at the first ask

    @property
    def busy(self) -> bool:
        return self.job is not None

    def ask(self, run_path: str, image: str, label: str | None = None) -> None:
        """The overlay of `image` through `run_path`'s best network, for its prediction or for `label`."""
        self.cancel()
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="traindeck-gradcam-")
        out = Path(self._folder.name) / f"cam-{abs(hash((image, label)))}.png"
        job = self.job = CliJob(commands.GradCam(run_dir=str(run_path), image=image, out=str(out), cls=label), self)
        job.done.connect(lambda result: self._over(job) and self.done.emit(image, result))
        job.failed.connect(lambda error: self._over(job) and self.failed.emit(image, error))

    def _over(self, job: CliJob) -> bool:
        """The job has answered; False when it is not the one asked last (its answer is dropped)."""
        if job is not self.job:
            return False
        self.job = None
        return True

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None

    def close(self) -> None:
        self.cancel()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
