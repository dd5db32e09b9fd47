"""The queue from the app: Add to queue starts a scheduler that outlives the window, the Queue page shows and
controls the runs, the sweep dialog queues a grid and shows the trainer's refusal of a bad one."""

import os
import signal

import pytest
from helpers import write_config

from app.main_window import PAGES
from trainer.core.rundir import RunDir
from trainer.runs import queue


@pytest.fixture
def schedulers_stopped(tmp_path):
    """The detached scheduler outlives the window (as it should): stop it after the test."""
    yield
    for pid in queue.live_schedulers(tmp_path / "runs"):
        os.kill(pid, signal.SIGTERM)


def wait_ready(qtbot, window):
    qtbot.waitUntil(lambda: window.device_page.probe is not None, timeout=60_000)
    qtbot.waitUntil(lambda: window.start_action.isEnabled(), timeout=60_000)


@pytest.mark.slow
def test_add_to_queue_runs_it_in_a_scheduler_that_outlives_the_app(qtbot, make_window, shapes_dir, tmp_path,
                                                                   schedulers_stopped):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    window = make_window(cfg)
    wait_ready(qtbot, window)
    with qtbot.waitSignal(window.queue_page.changed, timeout=30_000):
        window.queue_action.trigger()
        window.queue_action.trigger()  # a double click queues one run
    qtbot.waitUntil(lambda: window.queue_action.isEnabled(), timeout=30_000)
    qtbot.waitUntil(lambda: bool(queue.live_schedulers(tmp_path / "runs")), timeout=30_000)
    assert len([p for p in (tmp_path / "runs").iterdir() if (p / "status.json").exists()]) == 1, "one click, one run"
    page = window.queue_page
    window.nav.setCurrentRow(PAGES.index("Queue"))
    qtbot.waitUntil(lambda: page.rows and page.rows[0]["state"] == "completed", timeout=120_000)
    assert "scheduler running" in page.scheduler_label.text() and not page.start_scheduler.isEnabled()
    run = RunDir(page.rows[0]["path"])
    qtbot.waitUntil(lambda: run.read_status()["queue"]["scheduler"] is None, timeout=10_000)  # reaped: done
    page.table.selectRow(0)
    assert page.buttons["Retry"].isEnabled() is False and page.buttons["Hold"].isEnabled() is False


@pytest.mark.slow
def test_sweep_dialog_queues_a_grid_and_shows_a_refusal(qtbot, make_window, shapes_dir, tmp_path, schedulers_stopped):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    window = make_window(cfg)
    wait_ready(qtbot, window)
    dialog = window.run_actions.open_sweep_dialog()
    dialog.name.setText("lrs")
    dialog.grid.item(0, 1).setText("0.01, 0.02")
    dialog.add_grid_row("data.batch_size", "8, 16")
    with qtbot.waitSignal(dialog.queued, timeout=60_000) as got:
        dialog.submit()
    runs = [RunDir(p) for p in got.args[0]]
    assert len(runs) == 4 and "queued 4 runs" in dialog.result.text()
    values = sorted((r.read_status()["queue"]["values"]["optimizer.lr"],
                     r.read_status()["queue"]["values"]["data.batch_size"]) for r in runs)
    assert values == [(0.01, 8), (0.01, 16), (0.02, 8), (0.02, 16)]
    for r in runs:  # take them out again: this test is about the dialog, not about training four runs
        if r.read_status()["state"] == "queued" and not r.read_status()["queue"].get("scheduler"):
            queue.remove(tmp_path / "runs", r)
    dialog.add_grid_row("optimizer.momentum", "")
    dialog.submit()
    qtbot.waitUntil(lambda: "grid.optimizer.momentum: give a non-empty list" in dialog.result.text(), timeout=30_000)
    dialog.close()


@pytest.mark.slow
def test_a_queued_run_waits_while_the_run_started_from_the_window_goes(qtbot, make_window, shapes_dir, tmp_path,
                                                                       schedulers_stopped):
    """Issue #71: the scheduler started a queued run while the window's own run was still going (two jobs on two
    cores). It waits until the window's run has ended, tested and exported, then starts."""
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 2}, monitor={"log_every": 1})
    window = make_window(cfg)
    wait_ready(qtbot, window)
    window.run_actions.start()
    qtbot.waitUntil(lambda: window.run_model is not None and bool(window.run_model.start_event), timeout=60_000)
    with qtbot.waitSignal(window.queue_page.changed, timeout=30_000):
        window.queue_action.trigger()
    qtbot.waitUntil(lambda: bool(queue.live_schedulers(tmp_path / "runs")), timeout=30_000)
    (waiting,) = queue.queued(tmp_path / "runs")
    while window.runs.running:  # every look while the window's run goes: the queued one has not started
        assert waiting.read_status()["state"] == "queued", "started beside the window's run"
        qtbot.wait(300)
    assert window.run_model.state == "completed"
    qtbot.waitUntil(lambda: waiting.read_status()["state"] in ("running", "completed"), timeout=60_000)
