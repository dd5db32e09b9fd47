"""What keeps the README's test command finishing on a busy machine (issue #66), loaded with `-p suite_guard`.

- **A timeout reaches a test waiting in Qt's event loop.** pytest-timeout's SIGALRM raises its failure in whatever
  Python code runs when it fires; inside a Qt slot (a timer's, a QProcess's) PySide swallows it and the event loop
  goes on, so a test waiting in `qtbot.waitUntil` outlived its timeout until faulthandler ended the whole worker.
  Here the alarm also leaves every Qt wait in progress, and the wait raises the timeout on its way out, outside any
  slot: the test fails by its timeout, its fixtures are torn down, and the worker goes on.
- **A last resort for a test stuck where no Python runs** (C code): `GRACE` seconds after its timeout the worker
  dumps every thread's stack and ends, and xdist starts another one.
- **Nothing the tests started outlives the session.** Every process the tests start carries this session's mark in
  its environment (`TRAINDECK_TEST_SESSION`, set by the controller before the workers start); when the session ends
  the controller stops every process so marked and everything below it (an sshd and its sessions, an ssh master, a
  SLURM daemon and its jobs, a trainer), even those of a worker that died, and says which it had to stop.
- **xdist's loadfile scheduling survives that.** pytest-xdist 3.8's LoadScopeScheduling put a crashed worker's whole
  workload back on the queue, finished modules included, as empty units that no worker ever completes, and handed a
  replacement worker a unit of one test while the worker waits for two (pytest-xdist #1323, #1327, #1378): the
  session waited for ever. `remove_node` here requeues only the modules with tests left (the test the worker died on
  is reported failed, not run again), and `_reschedule` skips finished units and gives a worker two tests or the end.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest

GRACE = float(os.environ.get("SUITE_GUARD_GRACE", 60))  # seconds after a test's timeout for it to end by it, before
# its worker is ended (the meta-test sets a short one)

_qt_waits: list = []  # the pytest-qt blockers whose event loop is running now
_expired: str | None = None  # a timeout not yet raised to the test


def _raise_expired() -> None:
    global _expired
    if _expired is not None:
        message, _expired = _expired, None
        pytest.fail(message, pytrace=False)


def _guard_qt_waits() -> None:
    """Every qtbot wait (wait, waitUntil, waitSignal(s), waitCallback) is left when the test's time is up."""
    try:
        from pytestqt import wait_signal
    except ImportError:
        return
    for cls in (wait_signal._AbstractSignalBlocker, wait_signal.CallbackBlocker):
        if getattr(cls.wait, "guarded", False):
            continue
        original = cls.wait

        def wait(self, _original=original):
            __tracebackhide__ = True
            _raise_expired()
            _qt_waits.append(self)
            try:
                _original(self)
            finally:
                _qt_waits.remove(self)
            _raise_expired()

        wait.guarded = True
        cls.wait = wait


def _patch_loadscope() -> None:
    try:
        from xdist.scheduler.loadscope import LoadScopeScheduling
    except ImportError:
        return
    if not all(hasattr(LoadScopeScheduling, name) for name in ("_assign_work_unit", "_pending_of", "remove_node")):
        return  # another xdist than the one these two methods were written against: left as it is

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        crashitem = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
        for scope, unit in workload.items():
            if crashitem in unit:
                unit[crashitem] = True  # reported failed by xdist; run again it would take the next worker down
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        if node.shutting_down:
            return
        while self._pending_of(self.assigned_work[node]) <= 2:
            while self.workqueue and all(next(iter(self.workqueue.values())).values()):
                self.workqueue.popitem(last=False)  # a unit whose tests have all run
            if not self.workqueue:
                node.shutdown()  # a worker runs its last test once it knows there is no next one
                return
            self._assign_work_unit(node)

    LoadScopeScheduling.remove_node = remove_node
    LoadScopeScheduling._reschedule = _reschedule


MARK = "TRAINDECK_TEST_SESSION"
STOP_WAIT_S = 5.0


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: it schedules, and it alone marks the session
        _patch_loadscope()
        os.environ[MARK] = uuid.uuid4().hex  # a session inside a test (the meta-tests) has a mark of its own
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupted)  # `kill` (a CI's timeout): the session still ends, cleaned
    _guard_qt_waits()


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # pytest ends the session on it: pytest_sessionfinish runs


def left_running(mark: str) -> list:
    """The processes carrying `mark` in their environment, and everything below them, but this process and its
    parents."""
    import psutil

    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid in spared or proc.environ().get(MARK) != mark:
                continue
            found[proc.pid] = proc
            found.update((child.pid, child) for child in proc.children(recursive=True))
        except psutil.Error:
            continue
    return [proc for pid, proc in found.items() if pid not in spared]


def stop_left_running(mark: str) -> list[str]:
    """Stop what `left_running` finds (SIGTERM, then SIGKILL after STOP_WAIT_S); each one's name and pid."""
    import psutil

    procs = left_running(mark)
    said = []
    for proc in procs:
        try:
            said.append(f"{proc.name()} ({proc.pid})")
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=STOP_WAIT_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return said


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput") or not os.environ.get(MARK):
        return
    stopped = stop_left_running(os.environ[MARK])
    if stopped:
        session.config._suite_guard_stopped = stopped


def pytest_terminal_summary(terminalreporter, config):
    stopped = getattr(config, "_suite_guard_stopped", None)
    if stopped:
        terminalreporter.write_sep("-", "processes the tests left running, stopped at the session's end")
        terminalreporter.write_line(", ".join(stopped))


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's signal method, with the Qt waits left at the alarm and a last resort after GRACE."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None
    from pytest_timeout import dump_stacks, timeout_sigalrm, timeout_timer

    last_resort = threading.Timer(settings.timeout + GRACE, timeout_timer, (item, settings))
    last_resort.daemon = True

    def on_alarm(signum, frame):
        global _expired
        __tracebackhide__ = True
        if not _qt_waits:
            timeout_sigalrm(item, settings)  # the stacks, then the failure where the test is
            return
        terminal = item.config.get_terminal_writer()
        terminal.sep("+", title="Timeout")
        dump_stacks(terminal)
        _expired = f"Timeout >{settings.timeout}s (in a Qt wait)"
        for blocker in list(_qt_waits):
            blocker._loop.quit()  # the wait returns and raises the timeout outside any slot, where nothing swallows it

    def cancel():
        global _expired
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        last_resort.cancel()
        _expired = None

    item.cancel_timeout = cancel
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    last_resort.start()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    global _expired
    _expired = None  # raised (or propagated) in the call: the teardown's own waits run
