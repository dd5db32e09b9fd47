"""Work off the GUI thread: Python callables on the thread pool, `main.py` commands as QProcesses.

Results come back as Qt signals (queued to the GUI thread); nothing here waits.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import shiboken6
from PySide6.QtCore import QCoreApplication, QIODevice, QObject, QProcess, QRunnable, QThreadPool, QTimer, Signal

from trainer.runs.commands import Command, Resident
from trainer.runs.launch import main_command
from trainer.runs.resident import LONG_COMMANDS, RESIDENT_COMMANDS

log = logging.getLogger(__name__)
GENTLE_CANCEL_MS = 3000  # a command cancelled gently (CliJob gentle_cancel) has this long to clean up
STOP_WAIT_MS = 2000  # the resident worker, killed at quit: at most this long for the OS to say it has gone


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
_collections_held = 0
_collections_lock = threading.Lock()


@contextlib.contextmanager
def without_collection_pauses() -> Iterator[None]:
    """For a job that builds many objects the app keeps (a scan of 100,000 images): Python's cyclic garbage collector
    stays off while it runs, and what it built is frozen after (`gc.freeze`, as the app does at start), so that no
    full collection over it holds the interpreter lock, and the GUI thread with it (up to 0.2 s each, several a
    scan). Objects without cycles are freed as always; nested and concurrent jobs share the one switch."""
    global _collections_held
    with _collections_lock:
        _collections_held += 1
        gc.disable()
    try:
        yield
    finally:
        with _collections_lock:
            _collections_held -= 1
            if not _collections_held:
                gc.freeze()
                gc.enable()


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


def start_detached(request: Command, log_file: Path) -> bool:
    """The command `request` as a process of its own that outlives the app (the queue's scheduler, an Optuna
    study), its output appended to `log_file`; whether it started."""
    program, *arguments = main_command(*request.argv())
    process = QProcess()
    process.setProgram(program)
    process.setArguments(arguments)
    process.setStandardOutputFile(str(log_file), QIODevice.OpenModeFlag.Append)
    process.setStandardErrorFile(str(log_file), QIODevice.OpenModeFlag.Append)
    return process.startDetached()


def run_to_end(request: Command, timeout: float) -> subprocess.CompletedProcess:
    """The command `request` to its end, its output as text: for a function already on the thread pool
    (`run_in_thread`), never the GUI thread."""
    return subprocess.run(main_command(*request.argv()), capture_output=True, text=True, timeout=timeout)


class CliJob(QObject):
    """`python main.py ARGS`; `done` carries its stdout parsed as JSON (or the text, with parse_json=False).

    The quick questions (`RESIDENT_COMMANDS`: describe a model, probe the devices, Grad-CAM, predict) go to the app's
    resident worker (`ResidentWorker`), which has torch imported already; the others run as a process of their own.
    Either way the answer is the command's, exit code and output. An exit code in `ok_codes` other than 0 still counts
    as done when the command printed its answer (`predict` exits 2 when some files could not be read, and lists them
    in its JSON)."""

    done = Signal(object)
    failed = Signal(str)
    progress = Signal(str)  # each line the command writes to stderr as it goes (a fetch's percentage)

    def __init__(self, request: Command, parent: QObject | None = None, parse_json: bool = True,
                 ok_codes: tuple[int, ...] = (0,), gentle_cancel: bool = False):
        super().__init__(parent)
        self.request = request
        self.args = request.argv()
        self.gentle_cancel = gentle_cancel  # cancel asks the command to stop (SIGTERM: it cleans up), then kills it
        self.parse_json = parse_json
        self.ok_codes = ok_codes
        self.cancelled = False
        self._stderr = b""
        self.process: QProcess | None = None
        if self.args and self.args[0] in RESIDENT_COMMANDS and os.environ.get("TRAINDECK_RESIDENT", "1") != "0":
            ResidentWorker.shared().ask(self)
            return
        self.process = QProcess(self)
        self.process.readyReadStandardError.connect(self._stderr_ready)
        self.process.finished.connect(self._finished)
        self.process.errorOccurred.connect(self._error)
        program, *arguments = main_command(*self.args)
        self.process.start(program, arguments)

    def _finished(self, code: int, status) -> None:
        out = bytes(self.process.readAllStandardOutput()).decode("utf-8", "replace")
        self._stderr += bytes(self.process.readAllStandardError())
        self.answer(code, out, self._stderr.decode("utf-8", "replace"))

    def answer(self, code: int, out: str, err: str) -> None:
        """The command ended with `code`, having written `out` and `err`: `done` or `failed`, once."""
        if self.cancelled:
            self.deleteLater()
            return
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
        """Stop the command (a resident question's answer is dropped); neither `done` nor `failed` will be emitted."""
        self.cancelled = True
        if self.process is None:
            ResidentWorker.shared().cancel(self)
        elif self.process.state() != QProcess.ProcessState.NotRunning and self.gentle_cancel:
            self.process.terminate()
            QTimer.singleShot(GENTLE_CANCEL_MS, self._kill_if_running)
        elif self.process.state() != QProcess.ProcessState.NotRunning:
            self.process.kill()

    def _kill_if_running(self) -> None:
        if shiboken6.isValid(self) and self.process is not None and \
                self.process.state() != QProcess.ProcessState.NotRunning:
            self.process.kill()


class ResidentWorker(QObject):
    """The app's one resident worker (`main.py resident`, trainer/runs/resident.py): started at the first question,
    asked one JSON line per question (the asker's environment and folder with it) and answered in order. If it dies
    (killed, crashed), it is started again and the questions it had not answered are asked again, once; a question
    it dies on twice fails with the reason. The GUI process itself never imports torch."""

    _shared: ResidentWorker | None = None

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.process: QProcess | None = None
        self.pid: int | None = None  # the worker's, once it said it is ready
        self._buffer = b""
        self._next = 1
        self._waiting: dict[int, CliJob] = {}  # asked and not answered, in the order asked
        self._retried: set[int] = set()
        self._sent: set[int] = set()
        self._start_pending = False

    @classmethod
    def shared(cls) -> ResidentWorker:
        """The application's worker (made on first use, owned by the application)."""
        if cls._shared is None or not shiboken6.isValid(cls._shared):
            app = QCoreApplication.instance()
            cls._shared = cls(app)
            app.aboutToQuit.connect(cls._shared.stop)
        return cls._shared

    def ask(self, job: CliJob) -> None:
        ident, self._next = self._next, self._next + 1
        self._waiting[ident] = job
        if self.process is None and not self._start_pending:
            # started from the event loop: after what the GUI thread is doing now (a window's first paint: the
            # window's own questions are asked while it is built, and it shows before the worker's start costs it)
            self._start_pending = True
            QTimer.singleShot(0, self._start)
        elif self.process is not None and self.pid is not None:
            self._send(ident)

    def _start(self) -> None:
        self._start_pending = False
        if self.process is not None or not self._waiting:
            return  # started meanwhile, or nothing is asked any more (stopped)
        self.pid = None
        self._buffer = b""
        self._sent.clear()
        self.process = process = QProcess(self)
        # each slot told which process spoke: a worker that ended may still have output queued for the event loop,
        # after `self.process` is None or the next worker
        process.readyReadStandardOutput.connect(lambda: process is self.process and self._read())
        process.readyReadStandardError.connect(lambda: process is self.process and self._log())
        process.finished.connect(self._died)
        self.process.errorOccurred.connect(self._not_started)
        program, *arguments = main_command(*Resident().argv())
        self.process.start(program, arguments)

    def _send(self, ident: int) -> None:
        job = self._waiting[ident]
        request = {"id": ident, "argv": job.args, "env": dict(os.environ), "cwd": os.getcwd()}
        self.process.write((json.dumps(request) + "\n").encode("utf-8"))
        self._sent.add(ident)

    def _read(self) -> None:
        self._buffer += bytes(self.process.readAllStandardOutput())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                reply = json.loads(line)
            except ValueError:
                log.warning("resident worker: an unreadable reply line: %.200r", line)
                continue
            if reply.get("ready"):
                self.pid = reply.get("pid")
                for ident in list(self._waiting):
                    self._send(ident)
                continue
            if "progress" in reply:  # a line the command wrote as it went: the answer is still to come
                job = self._waiting.get(reply.get("id"))
                if job is not None and shiboken6.isValid(job) and not job.cancelled:
                    job.progress.emit(str(reply["progress"]))
                continue
            job = self._waiting.pop(reply.get("id"), None)
            self._sent.discard(reply.get("id"))
            if job is not None and shiboken6.isValid(job):
                job.answer(int(reply.get("code", 1)), reply.get("stdout", ""), reply.get("stderr", ""))

    def _log(self) -> None:
        text = bytes(self.process.readAllStandardError()).decode("utf-8", "replace").strip()
        if text:
            log.debug("resident worker: %s", text[-2000:])

    def _died(self, code: int, status) -> None:
        log.warning("resident worker ended (exit code %s) with %d question(s) unanswered", code, len(self._waiting))
        self.process.deleteLater()
        self.process, self.pid = None, None
        for ident in list(self._waiting):
            if ident in self._retried:  # it died on this one twice: the question is its cause, or the machine is
                job = self._waiting.pop(ident)
                if shiboken6.isValid(job):
                    job.answer(1, "", f"error: the resident worker stopped while answering {job.args[0]} twice "
                                      f"(exit code {code})")
            else:
                self._retried.add(ident)
        if self._waiting:
            self._start()

    def _not_started(self, error) -> None:
        """Python could not be started at all: every question waiting fails, saying so (none would be answered)."""
        if error != QProcess.ProcessError.FailedToStart:
            return  # a crash is `finished`'s to handle
        self.process.deleteLater()
        self.process, self.pid = None, None
        waiting, self._waiting = self._waiting, {}
        for job in waiting.values():
            if shiboken6.isValid(job):
                job.answer(1, "", "error: could not start python for the resident worker")

    def cancel(self, job: CliJob) -> None:
        """`job`'s answer is no longer wanted. A long command the worker is on (the learning-rate finder) is given up
        by restarting the worker, which then answers the other questions; a quick one is answered and dropped."""
        ident = next((i for i, j in self._waiting.items() if j is job), None)
        if ident is None:
            return
        if ident not in self._sent or job.args[0] not in LONG_COMMANDS:
            return  # answered in seconds (or not yet asked): its answer is dropped when it comes
        del self._waiting[ident]
        self._sent.discard(ident)
        if self.process is not None:
            self.process.kill()  # `_died` starts it again for the questions still waiting

    def stop(self) -> None:
        """End the worker (the questions it had not answered are dropped)."""
        self._waiting.clear()
        if self.process is not None:
            self.process.finished.disconnect(self._died)
            self.process.kill()
            # reaped now (a killed process goes at once): at the app's quit, Qt destroying a QProcess whose end it
            # had not yet seen printed "QProcess: Destroyed while process ... is still running"
            self.process.waitForFinished(STOP_WAIT_MS)
            self.process = None
            self.pid = None
