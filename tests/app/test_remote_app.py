"""A run on a host, driven from the app through a real sshd: Run on, the host's folder scanned there, Start, curves
move; the app closes and the laptop's follower dies mid-run; a new app re-attaches with nothing missing from the
curves; Stop works there; the results and the error gallery show from the mirror."""

from __future__ import annotations

import signal

import psutil
import pytest
from helpers import write_config
from PySide6.QtWidgets import QPushButton
from test_main_window import wait_ready

from app.dialogs.remote_browser import RemoteFolderDialog
from trainer.core.events import read_events
from trainer.core.rundir import RunDir

pytestmark = pytest.mark.slow


def kill_tree(pid: int) -> None:
    proc = psutil.Process(pid)
    for p in proc.children(recursive=True) + [proc]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs([proc], timeout=10)


def choose_host(qtbot, window, name: str) -> None:
    page = window.device_page
    qtbot.waitUntil(lambda: page.run_on.findData(name) >= 0, timeout=20_000)
    page.run_on.setCurrentIndex(page.run_on.findData(name))


def test_a_run_on_a_host_from_the_app_survives_the_app_and_its_follower(qtbot, make_window, hosts, shapes_dir,
                                                                        tmp_path):
    config = write_config(tmp_path, tmp_path / "not-here", train={"epochs": 400}, monitor={"log_every": 1})
    window = make_window(config, runs_dir=hosts["local_runs"])
    choose_host(qtbot, window, "loop")
    assert window.device_page.found_label.text() == "Found on loop"
    window.binder.widgets["data.train_dir"].setText(str(shapes_dir))  # as the remote folder browser would
    qtbot.waitUntil(lambda: window.dataset_page.scan_result is not None, timeout=60_000)
    assert "4 classes, 120 images" in window.dataset_page.summary.text()
    assert window.dataset_page.thumbs.count() == 4 * 6  # the host's thumbnails
    wait_ready(qtbot, window)
    window.start_action.trigger()
    qtbot.waitUntil(lambda: len(window.run_model.step_loss) >= 3, timeout=90_000)  # curves move
    run = window.run_model.run
    assert run.is_remote and run.path.parent == hosts["local_runs"] / "remote" / "loop"
    follower = window.process.pid

    window._leave_running = True  # close the app mid-run, then lose its follower too (a reboot, a crash)
    window.close()
    kill_tree(follower)
    window = make_window(config, runs_dir=hosts["local_runs"])  # reopened: a new follower catches up
    window.run_actions.open(str(run.path))
    assert window.process.running
    qtbot.waitUntil(lambda: window.run_model.epochs_done(window.run_model.last_step or {"epoch": 1}) >= 2,
                    timeout=90_000)
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.state == "stopped", timeout=90_000)
    qtbot.waitUntil(lambda: not window.process.running, timeout=30_000)

    remote = hosts["remote_runs"] / run.name
    assert run.events.read_bytes() == (remote / "events.jsonl").read_bytes()
    steps = [e["step"] for e in read_events(remote / "events.jsonl") if e["event"] == "step"]
    assert list(window.run_model.step_loss.x) == steps  # every step on the curve, once
    assert RunDir(remote).read_status()["state"] == "stopped" and (remote / "checkpoints" / "last.pt").exists()

    window.dashboard.tabs.setCurrentWidget(window.dashboard.results)
    tab = window.dashboard.results
    copies = str(run.path / "files")  # the mirror's copies of the host's images
    qtbot.waitUntil(lambda: tab.evaluation is not None and tab.evaluation.errors()
                    and tab.evaluation.errors()[0].path.startswith(copies), timeout=20_000)
    assert all(p.path.startswith(copies) for p in tab.evaluation.errors()[:5])
    qtbot.waitUntil(lambda: tab.gallery.count() > 0 and not tab.gallery.item(0).icon().isNull(), timeout=10_000)

    from app.dialogs.export_dialog import ExportDialog  # Export brings the ONNX file home, saying how far the fetch is

    dialog = ExportDialog(str(run.path), window)
    dialog.format.setCurrentIndex(dialog.format.findData("onnx"))
    home = tmp_path / "home" / "model.onnx"
    dialog.out.setText(str(home))
    seen = []
    dialog.export()
    dialog.job.progress.connect(seen.append)
    qtbot.waitUntil(lambda: dialog.job is None, timeout=120_000)
    assert "exported" in dialog.result.text() and home.stat().st_size > 1000
    assert any(line.startswith("fetching exports/model.onnx from loop: 100%") for line in seen)
    dialog.close()


def test_a_slurm_run_from_the_app_shows_pending_with_its_reason_then_its_results(qtbot, make_window, slurm, hosts,
                                                                                 shapes_dir, tmp_path):
    import os
    import subprocess

    blocker = subprocess.run(["sbatch", "--parsable", f"--cpus-per-task={os.cpu_count()}", "--output=/dev/null",
                              "--wrap", "sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        window = make_window(write_config(tmp_path, shapes_dir, train={"epochs": 2}), runs_dir=hosts["local_runs"])
        choose_host(qtbot, window, "cluster")
        assert window.device_page.run_on.currentText() == "cluster (SLURM through loop)"
        wait_ready(qtbot, window)
        window.start_action.trigger()
        qtbot.waitUntil(lambda: "pending (Resources)" in window.status.state_label.text(), timeout=60_000)
        assert "SLURM job" in window.status.state_label.text()
    finally:
        subprocess.run(["scancel", blocker])
    qtbot.waitUntil(lambda: window.run_model.state == "completed", timeout=120_000)
    qtbot.waitUntil(lambda: not window.process.running, timeout=60_000)
    window.dashboard.tabs.setCurrentWidget(window.dashboard.results)
    qtbot.waitUntil(lambda: window.dashboard.results.evaluation is not None, timeout=20_000)
    assert window.dashboard.results.evaluation.metrics["images"] > 0


def test_a_slurm_run_preempted_shows_preempted_then_pending_then_running_again_and_its_requeue(qtbot, make_window,
                                                                                               slurm, hosts,
                                                                                               shapes_dir, tmp_path):
    """Issue #73: SLURM's warning signal to a run sent from the window (what SLURM sends before the time limit): the
    status bar says preempted, then SLURM's pending word, then running again from the checkpoint; the run completes
    in the same mirror; the dashboard lists the restart and the Runs page says requeued 1×."""
    import json
    import subprocess

    from PySide6.QtCore import Qt

    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 2}, monitor={"log_every": 1})
    window = make_window(cfg, runs_dir=hosts["local_runs"])
    choose_host(qtbot, window, "cluster")
    wait_ready(qtbot, window)
    said: list[str] = []
    window.runs.stateText.connect(said.append)
    window.start_action.trigger()
    qtbot.waitUntil(lambda: window.run_model is not None and len(window.run_model.step_loss) >= 3, timeout=120_000)
    run = window.run_model.run
    job = json.loads((run.path / "remote.json").read_text())["job"]
    subprocess.run(["scancel", "--signal=USR1", str(job)], check=True)
    qtbot.waitUntil(lambda: window.run_model.state == "preempted", timeout=60_000)
    assert "preempted" in window.status.state_label.text()
    from tests.remote.test_slurm_requeue import ended

    # SLURM holds a requeued job two minutes: `ended` lets it go a few seconds in, as an administrator may
    qtbot.waitUntil(lambda: not ended(str(job)) and window.run_model.state == "completed", timeout=240_000)
    waited = [t for t in said if "preempted and requeued; SLURM job" in t]
    resumed = [i for i, t in enumerate(said) if "resumed from epoch" in t]
    assert waited and resumed and said.index(waited[0]) < resumed[-1], "\n".join(said)
    lines = [window.dashboard.warnings.item(i).text() for i in range(window.dashboard.warnings.count())]
    assert any("SLURM requeued the job (restart 1)" in line for line in lines), lines
    page = window.runs_page
    page.refresh()
    qtbot.waitUntil(lambda: any(r["path"] == str(run.path) and r.get("requeues") for r in page.shown_rows()),
                    timeout=20_000)
    row = next(i for i, r in enumerate(page.shown_rows()) if r["path"] == str(run.path))
    column = [page.model.headerData(c, Qt.Orientation.Horizontal) for c in range(page.model.columnCount())]
    cell = page.proxy.index(row, column.index("status")).data()
    assert cell.startswith("completed · requeued 1×, ") and cell.endswith(" min lost"), cell


def test_the_auto_box_with_a_slurm_host_plans_a_multi_label_run_inside_the_job_and_stop_stops_it(
        qtbot, make_window, slurm, simulated, hosts, tmp_path):
    """On a SLURM host Auto runs inside the job (`main.py auto --host cluster`, what the trainer answers the app's
    plan-only question with): the folder and its labels file are read there (the Dataset page's scan too), the job's
    node measures and plans a multi-label run, the budget counts from the job's start less Auto's own planning, and
    the choices reach the Auto box. Stop then stops the job's run with a checkpoint, there."""
    import json
    import re

    from helpers import digit_mosaics

    labels = digit_mosaics(tmp_path / "data", 400)
    window = make_window(write_config(tmp_path, tmp_path / "not-here"), runs_dir=hosts["local_runs"])
    choose_host(qtbot, window, "cluster")
    window.binder.widgets["data.train_dir"].setText(str(labels.parent))  # as the remote folder browser would
    window.findChild(QPushButton, "browse:data.labels").click()  # the labels file, browsed there
    browser = window.findChild(RemoteFolderDialog)
    qtbot.waitUntil(lambda: browser.entries.count() > 1, timeout=30_000)
    shown = [browser.entries.item(i).text() for i in range(browser.entries.count())]
    assert shown[0].startswith("images/") and shown[-1] == "labels.csv", shown
    assert not browser.ok.isEnabled(), "a folder is not a labels file"
    browser.entries.setCurrentRow(len(shown) - 1)
    browser.ok.click()
    assert window.binder.widgets["data.labels"].text() == str(labels)
    page = window.dataset_page
    qtbot.waitUntil(lambda: page.scan_result is not None or "Scanning" not in page.summary.text(), timeout=60_000)
    assert "Multi-label: 10 labels on 400 images" in page.summary.text(), page.summary.text()
    assert page.thumbs.count() > 0, "the host's thumbnails of each label"
    panel = page.auto
    panel.minutes.setValue(0.5)
    panel.button.click()
    qtbot.waitUntil(lambda: window.runs.running, timeout=60_000)
    assert "SLURM cluster" in panel.status.text() and not panel.choices.isVisible()
    qtbot.waitUntil(lambda: window.run_model is not None and panel.shown_run == window.run_model.run.path,
                    timeout=180_000)
    mirror = window.run_model.run.path
    assert mirror.parent == hosts["local_runs"] / "remote" / "cluster"
    job = json.loads((mirror / "remote.json").read_text())["job"]
    job_output = (hosts["remote_runs"] / "configs" / f"slurm-{job}.out").read_text()
    assert "auto: measuring" in job_output and "run directory:" in job_output, "planned inside the job, there"
    shown = {panel.choices.item(i, 0).text(): panel.choices.item(i, 2).text() for i in range(panel.choices.rowCount())}
    planning_s = float(re.search(r"less (\d+) s of planning", shown["train.budget"]).group(1))
    planned = {c["key"]: c["value"] for c in json.loads((mirror / "auto.json").read_text())["choices"]}
    assert abs(60 * planned["train.budget"] + planning_s - 30) <= 1.5, "the budget lost nothing but planning"
    assert planned["data.labels"] == str(labels) and planned["loss.name"] == "asl", "a multi-label plan"

    qtbot.waitUntil(lambda: len(window.run_model.step_loss) > 0, timeout=60_000)  # training, there
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.ended and not window.runs.running, timeout=120_000)
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "stopped" and status["remote"]["job"]["active"] is False, status
    assert (hosts["remote_runs"] / f"slurm-{job}" / "checkpoints" / "last.pt").exists(), "stopped with a checkpoint"
    assert window.run_model.state == "stopped" and "stopped" in window.status.state_label.text().lower()


def test_the_auto_box_with_a_host_chosen_plans_there_and_starts_a_run_there(qtbot, make_window, simulated, hosts,
                                                                            shapes_dir, tmp_path, monkeypatch):
    window = make_window(write_config(tmp_path, shapes_dir), runs_dir=hosts["local_runs"])
    choose_host(qtbot, window, "loop")
    started = []
    monkeypatch.setattr(window.runs, "start", lambda cfg, choices=None: started.append((cfg, choices)))
    panel = window.dataset_page.auto
    panel.minutes.setValue(0.5)
    panel.button.click()
    qtbot.waitUntil(lambda: bool(started) or panel.button.isEnabled(), timeout=120_000)
    assert started, panel.status.text()
    cfg, choices = started[0]
    assert cfg.device.host == "loop" and window.device_page.host == "loop", "the run goes where it was planned"
    assert choices[0] == {"key": "device.host", "value": "loop", "why": choices[0]["why"]}
    shown = [panel.choices.item(i, 0).text() for i in range(panel.choices.rowCount())]
    assert shown[0] == "device.host" and "model.name" in shown
