import psutil
import pytest
from PySide6.QtCore import QSettings, QThreadPool, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app.jobs.background import ResidentWorker


@pytest.fixture(autouse=True)
def nothing_left_running(qapp):
    """Fail a test that leaves a child process, a pool thread or an active timer of a window behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    QThreadPool.globalInstance().waitForDone(10_000)
    assert QThreadPool.globalInstance().activeThreadCount() == 0, "a background job is still running"
    resident = ResidentWorker._shared.process.processId() if ResidentWorker._shared is not None and \
        ResidentWorker._shared.process is not None else None  # the app's one worker, shared by the tests' windows
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.pid != resident]
    _, alive = psutil.wait_procs(new, timeout=5)  # what the window killed on close gets a moment to go
    leftovers = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:  # a killed helper not yet reaped by Qt is gone, not running
                leftovers.append((p, p.cmdline()[:4]))
        except psutil.Error:  # it ended (or became a zombie) while being looked at
            continue
    for p, _ in leftovers:
        p.kill()
    assert not leftovers, f"processes left running: {[cmd for _, cmd in leftovers]}"
    timers = [t.parent().objectName() or type(t.parent()).__name__ for w in QApplication.topLevelWidgets()
              if w.isVisible() for t in w.findChildren(QTimer) if t.isActive()]
    assert not timers, f"timers still active in open windows: {timers}"


@pytest.fixture(autouse=True)
def no_blocking_dialogs(monkeypatch):
    """A static QMessageBox (warning, information, question, critical) runs a modal event loop no one answers here:
    the test would wait for good, out of pytest-timeout's reach (its alarm's exception is swallowed by the Qt slot it
    lands in). Each is answered at once (No for a question) and fails the test, with its text, unless the test
    patched it to expect it."""
    shown = []

    def record(kind):
        def show(parent, title, text, *args, **kwargs):
            shown.append(f"{kind} {title!r}: {text}")
            return QMessageBox.StandardButton.No if kind == "question" else QMessageBox.StandardButton.Ok
        return show

    for kind in ("warning", "information", "question", "critical"):
        monkeypatch.setattr(QMessageBox, kind, record(kind))
    yield
    assert not shown, f"a dialog no test expected: {shown}"


@pytest.fixture
def settings(tmp_path):
    return QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def make_window(qtbot, settings, tmp_path):
    from app.main_window import MainWindow

    windows = []

    def make(config_path=None, runs_dir=None):
        window = MainWindow(settings, runs_dir or tmp_path / "runs", config_path)
        window.show()  # not qtbot.addWidget: the teardown below stops the trainer before the window closes
        windows.append(window)
        return window

    yield make
    for w in windows:
        w.process.stop()
        if w.process.running:
            w.process.kill()
            qtbot.waitUntil(lambda w=w: not w.process.running, timeout=20_000)
        w._leave_running = True
        w.close()
        w.deleteLater()


@pytest.fixture(scope="session", autouse=True)
def collect_before_exit():
    """Collect Qt wrappers while the QApplication still exists (PySide6 can crash collecting them at exit)."""
    yield
    import gc

    if ResidentWorker._shared is not None:
        ResidentWorker._shared.stop()
    gc.collect()
    QApplication.processEvents()
