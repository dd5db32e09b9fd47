"""RunModel: the state of one run, fed from its run directory, exposed as numpy buffers and Qt signals.

The same code serves a run the app just started, a run re-attached after the app was closed, and a
finished run replayed from disk: all three read `events.jsonl` (docs/events.md). Reading happens on a
20 Hz timer within a time budget, so even a huge history never stalls the GUI thread.
"""

from __future__ import annotations

import collections
import logging
import time

from PySide6.QtCore import QObject, QTimer, Signal

from app.buffers import Matrix, Series
from trainer.events import EventTail
from trainer.rundir import FINAL_STATES, RunDir

log = logging.getLogger(__name__)

POLL_MS = 40
CHUNK_BYTES = 64 << 10  # read and parsed at once
BUDGET_S = 0.010  # GUI-thread time one poll may spend on events; the rest waits for the next poll


class LogTail:
    """New text appended to a file since the last read."""

    def __init__(self, path):
        self.path = path
        self.offset = 0

    def read_new(self, max_bytes: int = 64 << 10) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                if size - self.offset > 4 * max_bytes:  # a flood: skip to the recent part
                    self.offset = size - max_bytes
                f.seek(self.offset)
                chunk = f.read(max_bytes)
        except OSError:
            return ""
        self.offset += len(chunk)
        return chunk.decode("utf-8", "replace")


class RunModel(QObject):
    preparing = Signal(dict)  # before the first step: scan, cache build (with done/total), model
    runStarted = Signal(dict)
    stepLogged = Signal(dict)
    epochEnded = Signal(dict)
    warningRaised = Signal(dict)
    errorRaised = Signal(dict)
    systemSampled = Signal(dict)
    finished = Signal(str, str)  # final state, message
    logAppended = Signal(str)

    def __init__(self, run: RunDir, parent: QObject | None = None):
        super().__init__(parent)
        self.run = run
        self.state = "starting"
        self.message = ""
        self.start_event: dict = {}
        self.last_epoch: dict = {}
        self.best_epoch: dict = {}
        self.last_step: dict = {}
        self.layer_table: dict = {}
        self.layers: list[str] = []
        self.group_names: list[str] = []
        self.warnings: list[dict] = []
        self.histograms: dict[tuple[str, str], list[dict]] = {}  # (layer, kind) -> events, oldest first
        self.step_loss = Series()
        self.grad_norm = Series()
        self.images_per_s = Series()
        self.train_loss = Series()
        self.val_loss = Series()
        self.val_acc = Series()
        self.lr: list[Series] = []
        self.layer_grad: Matrix | None = None
        self.cpu = Series()
        self.memory = Series()
        self._events = EventTail(run.events)
        self._log = LogTail(run.output_log if run.output_log.exists() else run.log)
        self._ticks = 0
        self.catching_up = False  # the last poll ran out of time with events still unread (a flood or a replay)
        self._pending: collections.deque[dict] = collections.deque()
        self._ended = False
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.poll)

    # ---- lifecycle ---------------------------------------------------------------------------
    def watch(self) -> None:
        """Start reading (live or replay); stops by itself once the run has ended and all is read."""
        self.poll()
        if not self._ended:
            self._timer.start()

    def close(self) -> None:
        self._timer.stop()

    @property
    def watching(self) -> bool:
        return self._timer.isActive()

    @property
    def epochs(self) -> int:
        return self.start_event.get("config", {}).get("train", {}).get("epochs", 0)

    # ---- reading -----------------------------------------------------------------------------
    def poll(self) -> None:
        """Take in what was appended, within a time budget, so a flood of events never stalls the GUI."""
        deadline = time.perf_counter() + BUDGET_S
        got_any = bool(self._pending)
        self.catching_up = True
        while time.perf_counter() < deadline:
            if not self._pending:
                new = self._events.read_new(CHUNK_BYTES)
                if not new:
                    self.catching_up = False
                    break
                got_any = True
                self._pending.extend(new)
            while self._pending and time.perf_counter() < deadline:
                self._dispatch(self._pending.popleft())
        text = self._log.read_new()
        if text:
            self.logAppended.emit(text)
        self._ticks += 1
        if self._ended and not got_any and not self._pending:
            self._timer.stop()
        elif not got_any and self._ticks % 10 == 0:
            self._check_alive()

    def _check_alive(self) -> None:
        """A trainer killed without a word writes no run_end: notice it from its status and process."""
        state = self.run.effective_state()
        if state in FINAL_STATES and not self._ended:
            status = self.run.read_status()
            message = status.get("message") or "the trainer process ended without reporting (killed?)"
            if status.get("state") in ("running", "starting"):
                message = "the trainer process is gone (killed or crashed); resume continues from the last checkpoint"
            self._finish(state, message)
            self._timer.stop()

    def _finish(self, state: str, message: str) -> None:
        self._ended = True
        self.state, self.message = state, message
        self.finished.emit(state, message)

    def _dispatch(self, e: dict) -> None:
        kind = e.get("event")
        if kind == "prepare":
            self.preparing.emit(e)
        elif kind == "run_start":
            self._ended = False
            self.state = "running"
            self.start_event = e
            self.group_names = [g["name"] for g in e.get("param_groups", [])]
            while len(self.lr) < len(self.group_names):
                self.lr.append(Series())
            if e.get("layers") and (self.layer_grad is None or self.layer_grad.rows != len(e["layers"])):
                self.layers = e["layers"]
                self.layer_grad = Matrix(len(self.layers))
            self.runStarted.emit(e)
        elif kind == "step":
            step = e["step"]
            self.last_step = e
            self.step_loss.append(step, e.get("loss"))
            self.images_per_s.append(step, e.get("images_per_s"))
            if e.get("grad_norm") is not None:
                self.grad_norm.append(step, e["grad_norm"])
            for series, lr in zip(self.lr, e.get("lr", [])):
                series.append(step, lr)
            self.stepLogged.emit(e)
        elif kind == "grad_stats":
            self.layer_table = e
            if self.layer_grad is not None and len(e.get("grad_norm", [])) == self.layer_grad.rows:
                self.layer_grad.append(e["step"], e["grad_norm"])
        elif kind == "histogram":
            series = self.histograms.setdefault((e["layer"], e["kind"]), [])
            series.append(e)
            if len(series) > 2000:
                del series[::2]  # bounded: keep every other one of a long history
        elif kind == "epoch":
            self.last_epoch = e
            if not self.best_epoch or (e.get("val_acc") or 0) > (self.best_epoch.get("val_acc") or 0):
                self.best_epoch = e
            self.train_loss.append(e["epoch"], e.get("train_loss"))
            self.val_loss.append(e["epoch"], e.get("val_loss"))
            self.val_acc.append(e["epoch"], e.get("val_acc"))
            self.epochEnded.emit(e)
        elif kind == "system":
            t = e.get("time", 0.0)
            self.cpu.append(t, e.get("cpu_percent"))
            self.memory.append(t, e.get("rss_mb"))
            self.systemSampled.emit(e)
        elif kind == "warning":
            self.warnings.append(e)
            self.warningRaised.emit(e)
        elif kind == "error":
            self.errorRaised.emit(e)
        elif kind == "run_end":
            self._finish(e.get("status", "failed"), e.get("message", ""))
