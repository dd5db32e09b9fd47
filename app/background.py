"""Work off the GUI thread: Python callables on the thread pool, `main.py` commands as QProcesses.

Results come back as Qt signals (queued to the GUI thread); nothing here waits.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable

import shiboken6
from PySide6.QtCore import QObject, QProcess, QRunnable, QThreadPool, Signal

from trainer.runs.launch import main_command

log = logging.getLogger(__name__)


class _Signals(QObject):
    done = Signal(object)
    failed = Signal(str)


class _Job(QRunnable):
    def __init__(self, fn: Callable, signals: _Signals):
        super().__init__()
        self.fn = fn
        self.signals = signals

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as e:  # noqa: BLE001 - reported to the GUI, never lost
            log.debug("background job failed: %s", traceback.format_exc())
            self.signals.failed.emit(str(e) or type(e).__name__)
        else:
            self.signals.done.emit(result)


_alive: set = set()  # signal objects of jobs in flight (kept referenced until they report)


def _while_alive(owner: QObject, fn: Callable) -> Callable:
    """`fn`, skipped once `owner` (the widget that asked) has been destroyed: a result may arrive after its window
    closed."""
    return lambda *args: fn(*args) if shiboken6.isValid(owner) else None


def run_in_thread(fn: Callable, on_done: Callable, on_error: Callable | None = None,
                  owner: QObject | None = None, priority: int = 0) -> None:
    """Run `fn` on the thread pool; `on_done(result)` or `on_error(message)` on the GUI thread (not at all when
    `owner` is gone by then). A higher `priority` goes ahead of the jobs waiting (what the user waits for)."""
    if owner is not None:
        on_done = _while_alive(owner, on_done)
        on_error = _while_alive(owner, on_error) if on_error else None
    signals = _Signals()
    _alive.add(signals)
    signals.done.connect(on_done)
    if on_error:
        signals.failed.connect(on_error)
    signals.done.connect(lambda *_: _alive.discard(signals))
    signals.failed.connect(lambda *_: _alive.discard(signals))
    QThreadPool.globalInstance().start(_Job(fn, signals), priority)


class CliJob(QObject):
    """`python main.py ARGS`; `done` carries its stdout parsed as JSON (or the text, with parse_json=False).

    An exit code in `ok_codes` other than 0 still counts as done when the command printed its answer (`predict`
    exits 2 when some files could not be read, and lists them in its JSON)."""

    done = Signal(object)
    failed = Signal(str)
    progress = Signal(str)  # each line the command writes to stderr as it goes (a fetch's percentage)

    def __init__(self, args: list[str], parent: QObject | None = None, parse_json: bool = True,
                 ok_codes: tuple[int, ...] = (0,)):
        super().__init__(parent)
        self.parse_json = parse_json
        self.ok_codes = ok_codes
        self.cancelled = False
        self._stderr = b""
        self.process = QProcess(self)
        self.process.readyReadStandardError.connect(self._stderr_ready)
        self.process.finished.connect(self._finished)
        self.process.errorOccurred.connect(self._error)
        program, *arguments = main_command(*args)
        self.process.start(program, arguments)

    def _finished(self, code: int, status) -> None:
        if self.cancelled:
            self.deleteLater()
            return
        out = bytes(self.process.readAllStandardOutput()).decode("utf-8", "replace")
        self._stderr += bytes(self.process.readAllStandardError())
        err = self._stderr.decode("utf-8", "replace")
        if code != 0 and not (code in self.ok_codes and out.strip()):
            lines = [line for line in err.splitlines() if line.strip()]
            self.failed.emit(lines[-1].removeprefix("error: ") if lines else f"exit code {code}")
        elif not self.parse_json:
            self.done.emit(out)
        else:
            try:
                self.done.emit(json.loads(out))
            except json.JSONDecodeError:
                self.failed.emit(f"unreadable output: {out[:200]!r}")
        self.deleteLater()

    def _stderr_ready(self) -> None:
        new = bytes(self.process.readAllStandardError())
        self._stderr += new
        for line in new.decode("utf-8", "replace").splitlines():
            if line.strip():
                self.progress.emit(line.strip())

    def _error(self, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.failed.emit("could not start python")
            self.deleteLater()

    def cancel(self) -> None:
        """Kill the process; neither `done` nor `failed` will be emitted."""
        self.cancelled = True
        if self.process.state() != QProcess.ProcessState.NotRunning:
            self.process.kill()
