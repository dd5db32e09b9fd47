"""Faults around the app: a trainer deaf to SIGTERM, a log flood, the app itself killed mid-run."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, process_tree_gone, trusted_model, write_config
from PySide6.QtCore import QElapsedTimer, QTimer

from app.jobs.trainer_process import TrainerProcess
from trainer.core.rundir import RunDir, list_runs
from trainer.core.system import pid_alive

STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_is_forced_for_the_whole_tree_after_the_grace_period(qtbot, tmp_path):
    run = RunDir(tmp_path / "run").create()
    proc = TrainerProcess(grace_ms=1000)
    proc.start([sys.executable, "-c", STUBBORN], run.output_log)
    qtbot.waitUntil(lambda: run.output_log.read_text().strip() != "", timeout=10_000)
    child = int(run.output_log.read_text().split()[0])
    qtbot.waitUntil(lambda: child in proc._tree, timeout=5_000)
    with qtbot.waitSignal(proc.ended, timeout=10_000):
        proc.stop()
    assert proc.forced, "it ignored SIGTERM: the grace period ran out and it was killed"
    qtbot.waitUntil(lambda: not pid_alive(child) and not pid_alive(proc.pid), timeout=5_000)


FLOOD_MODEL = """
import sys, torch
from torch import nn

class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, x):
        sys.stdout.write(("flood " * 20 + "\\n") * 5000)  # ~600 kB per call
        return self.fc(x.mean((2, 3)))
"""


@pytest.mark.slow
def test_a_log_flood_never_blocks_the_trainer_or_the_app(qtbot, make_window, shapes_dir, tmp_path):
    from test_main_window import wait_ready

    name = trusted_model(tmp_path / "flood.py", FLOOD_MODEL)
    cfg = write_config(tmp_path, shapes_dir, model={"name": name}, train={"epochs": 4},
                       monitor={"log_every": 1}, data={"batch_size": 4})
    window = make_window(cfg)
    wait_ready(qtbot, window)
    gaps, clock = [], QElapsedTimer()
    clock.start()
    ticker = QTimer()
    ticker.setInterval(20)

    def tick():
        gaps.append(clock.restart())

    ticker.timeout.connect(tick)
    ticker.start()
    window.start_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.state == "completed", timeout=120_000)
    ticker.stop()
    output = window.run_model.run.output_log.stat().st_size
    assert output > 20_000_000, f"only {output} bytes were written"
    assert max(gaps[5:]) < 1000, f"the GUI thread stalled {max(gaps[5:])} ms"  # blocked would be forever
    assert "flood" in window.dashboard.log_view.toPlainText()
    assert window.dashboard.log_view.document().blockCount() <= 5001


@pytest.mark.slow
def test_the_app_killed_mid_run_leaves_the_trainer_running_and_reattachable(qtbot, make_window, shapes_dir,
                                                                             tmp_path):
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 2}, train={"epochs": 100}, monitor={"log_every": 1})
    runs = tmp_path / "runs"
    app = subprocess.Popen([sys.executable, str(REPO / "main.py"), "--config", str(cfg), "--runs-dir", str(runs),
                            "--autostart"], cwd=REPO, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        qtbot.waitUntil(lambda: bool(list_runs(runs)) and list_runs(runs)[0].read_status().get("state") == "running",
                        timeout=90_000)
        (run,) = list_runs(runs)
        app.send_signal(signal.SIGKILL)
        app.wait(timeout=10)
        trainer_pid = run.read_status()["pid"]
        time.sleep(1.5)
        assert pid_alive(trainer_pid) and run.effective_state() == "running", "the run goes on without the app"
    finally:
        if app.poll() is None:
            app.kill()
    window = make_window(cfg, runs_dir=runs)
    window.run_actions.open(str(run.path))
    assert window.process.running and window.process.pid == trainer_pid
    qtbot.waitUntil(lambda: len(window.run_model.step_loss) > 0, timeout=10_000)
    workers = [p for p in psutil.Process(trainer_pid).children(recursive=True)]
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: not window.process.running, timeout=30_000)
    qtbot.waitUntil(lambda: window.run_model.state == "stopped", timeout=10_000)
    assert process_tree_gone(trainer_pid, workers)


BAD_CONFIGS = [
    (b"- data\n- model\n", "config: must be a mapping"),
    (b"data: !!python/object/apply:os.system ['echo pwned']\n", "invalid YAML at line 1"),
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a text (UTF-8) YAML file"),
    (b"data: {batch_size: big}\n", "data.batch_size: must be an integer, got 'big'"),
    (b"train: {seed: 99999999999999999999}\n", "train.seed: must be <="),
]


def test_a_bad_config_opened_in_the_app_is_named_without_a_traceback(qtbot, make_window, shapes_dir, tmp_path,
                                                                     monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    window = make_window(write_config(tmp_path, shapes_dir))  # not the demo: writing it would outlive the test
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: shown.append((title, text)))
    for i, (content, expected) in enumerate(BAD_CONFIGS):
        shown.clear()
        path = tmp_path / f"bad{i}.yaml"
        path.write_bytes(content)
        assert not window.files.open(path)
        assert len(shown) == 1 and path.name in shown[0][1] and expected in shown[0][1], shown
        assert "Traceback" not in shown[0][1]


@pytest.mark.slow
def test_a_run_started_in_the_standby_trainer_stops_like_any_other(qtbot, shapes_dir, tmp_path):
    """The app keeps a standby trainer (torch already imported); Start hands the run to it, Stop stops it and
    checkpoints, and a fresh standby is ready for the next run; the last one leaves when the app lets it go."""
    from trainer.runs.launch import train_command

    proc = TrainerProcess()
    proc.keep_standby(str(REPO))
    standby = proc.standby
    assert standby is not None and standby.poll() is None
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 2}, train={"epochs": 50})
    run = RunDir(tmp_path / "run").create()
    proc.start(train_command(cfg, run_dir=run.path), run.output_log, cwd=str(REPO))
    assert proc.pid == standby.pid and proc.standby is None, "the run went to the standby, none is kept meanwhile"
    qtbot.waitUntil(lambda: run.read_status().get("state") == "running" and run.events.exists()
                    and '"event": "step"' in run.events.read_text(), timeout=120_000)
    with qtbot.waitSignal(proc.ended, timeout=60_000) as ended:
        proc.stop()
    assert ended.args == [0]
    assert run.read_status()["state"] == "stopped" and (run.checkpoints / "last.pt").exists()
    assert run.output_log.read_text().strip(), "the trainer's console output is in the run's output.log"
    following = proc.standby
    assert following is not None and following.pid != standby.pid
    proc.close_standby()
    # told to go, the unused standby leaves at once (it lingered ~20 s): quietly (0) once it is up, or by the
    # signal itself when that came while its interpreter was still starting
    assert following.wait(timeout=30) in (0, -signal.SIGTERM)
