"""RunModel: a thin Qt watcher over a RunState. It reads a run's new events on a timer and tells the views.

The state itself (`app.state.run_state.RunState`: buffers, summaries, ETA) is Qt-free and tested without Qt;
this class only polls `events.jsonl` (and the log) within a time budget, so even a huge history never
stalls the GUI thread, and turns each change into a signal.
"""

from __future__ import annotations

import collections
import logging
import os
import time

from PySide6.QtCore import QObject, QTimer, Signal

from app.state.run_state import RunState
from trainer.core.events import EventTail
from trainer.core.files import open_regular
from trainer.core.rundir import RunDir

log = logging.getLogger(__name__)

POLL_MS = 40
CHUNK_BYTES = 64 << 10  # read and parsed at once
BUDGET_S = 0.010  # GUI-thread time one poll may spend on events; the rest waits for the next poll
LIVENESS_EVERY = 10  # polls without news between checks that the trainer process is still there


class LogTail:
    """New text appended to a file since the last read: only a regular file of the run's own (a FIFO would block the
    window, a link would show another file)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0

    def read_new(self, max_bytes: int = 64 << 10) -> str:
        try:
            with os.fdopen(open_regular(self.path, "log", follow_links=False), "rb") as f:
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


class RunModel(QObject, RunState):
    """A RunState kept up to date from its run directory, with a signal per kind of change."""

    preparing = Signal(dict)  # before the first step: scan, cache build (with done/total), model
    runStarted = Signal(dict)
    stepLogged = Signal(dict)
    epochEnded = Signal(dict)
    warningRaised = Signal(dict)
    replanned = Signal(dict)  # train.replan changed the run's epochs
    restarted = Signal(dict)  # its SLURM job was requeued, or torchrun started its ranks again
    errorRaised = Signal(dict)
    systemSampled = Signal(dict)
    tested = Signal(dict)  # the test set's metrics, at the end of a run with data.test_dir
    finished = Signal(str, str)  # final state, message
    segmentExpected = Signal()  # a resume or continue was launched: the run is starting again, no longer ended
    logAppended = Signal(str)

    def __init__(self, run: RunDir, parent: QObject | None = None):
        super().__init__(parent, run=run)  # PySide6 passes `run` on to RunState.__init__ (cooperative init)
        self._events = EventTail(run.events, summary=True)  # a long run: its summary, then what came after
        self._log = LogTail(run.output_log if run.output_log.exists() else run.log)
        self._ticks = 0
        self.catching_up = False  # the last poll ran out of time with events still unread (a flood or a replay)
        self._pending: collections.deque[dict] = collections.deque()
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.poll)

    def reopen(self, summary_only: bool = False) -> None:
        """Read the run from the start again, through the summary it has now (built after this model was made);
        `summary_only`: that summary's events alone (one still being built, shown meanwhile)."""
        self._events = EventTail(self.run.events, summary=True, summary_only=summary_only)

    def expect_segment(self, since: float | None = None) -> None:
        super().expect_segment(since)
        self.segmentExpected.emit()

    def watch(self) -> None:
        """Start reading (live or replay); stops by itself once the run has ended and all is read."""
        self.poll()
        if not self.ended:
            self._timer.start()

    def close(self) -> None:
        self._timer.stop()

    @property
    def watching(self) -> bool:
        return self._timer.isActive()

    def poll(self) -> None:
        """Take in what was appended, within a time budget, so a flood of events never stalls the GUI."""
        deadline = time.perf_counter() + BUDGET_S
        got_any = bool(self._pending)
        self.catching_up = True
        while time.perf_counter() < deadline:
            if not self._pending:
                new = self._events.read_new(CHUNK_BYTES)
                if not new:
                    if self._events.at_end:
                        self.catching_up = False
                        break
                    continue  # a chunk inside a line too long to be an event: the next one, within the budget
                got_any = True
                self._pending.extend(new)
            while self._pending and time.perf_counter() < deadline:
                self._dispatch(self._pending.popleft())
        text = self._log.read_new()
        if text:
            self.logAppended.emit(text)
        self._ticks += 1
        if self.ended and not got_any and not self._pending and self.state != "preempted":  # a preempted run's
            self._timer.stop()  # SLURM job requeues itself: its next segment is read here as it comes
        elif not got_any and self._ticks % LIVENESS_EVERY == 0 and self.check_process():
            self.finished.emit(self.state, self.message)
            self._timer.stop()

    def _dispatch(self, e: dict) -> None:
        change = self.apply(e)
        if change == "finished":
            self.finished.emit(self.state, self.message)
        elif change is not None:
            getattr(self, change).emit(e)
