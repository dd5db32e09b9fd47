"""The dashboard's side panel: what a run says of itself while it goes."""

from helpers import read_all
from PySide6.QtCore import Qt


def dashboard_reading(qtbot, run, events: list[dict]):
    """A dashboard on `run`, its events file holding `events` (as the trainer writes them), all of them read."""
    import json

    from app.jobs.run_model import RunModel
    from app.training.dashboard import Dashboard

    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    model = RunModel(run)
    dashboard.set_model(model)
    read_all(model)
    return dashboard, model


def test_a_re_plan_is_a_line_on_the_dashboard_and_moves_the_epoch_counter(qtbot, tmp_path):

    from trainer.core.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    events = [{"event": "run_start", "config": {"train": {"epochs": 12, "budget": 2.0}}, "classes": ["a", "b"],
               "train_size": 10, "val_size": 2, "device": "cpu", "cache": "memory", "trainable": 10,
               "param_groups": [{"name": "default"}], "layers": [], "time": 1.0},
              {"event": "epoch", "epoch": 1, "val_acc": 0.5, "time": 2.0},
              {"event": "replan", "epoch": 1, "old_epochs": 12, "epochs": 31, "epoch_s": 2.5, "budget_left_s": 80,
               "why": "2.5 s per epoch measured, 80 s of the budget left: faster than planned", "time": 2.1},
              {"event": "epoch", "epoch": 2, "val_acc": 0.6, "time": 3.0},
              {"event": "replan", "epoch": 2, "old_epochs": 31, "epochs": 25, "epoch_s": 3.1, "budget_left_s": 74,
               "why": "3.1 s per epoch measured, 74 s of the budget left: slower than planned", "time": 3.1}]
    dashboard, model = dashboard_reading(qtbot, run, events)
    lines = [dashboard.warnings.item(i).text() for i in range(dashboard.warnings.count())]
    assert lines == ["↻ re-planned (2 times): 12 → 31 → 25 epochs (3.1 s per epoch measured, 74 s of the budget left: "
                     "slower than planned)"], "one line for a run's re-plans, not one an epoch"
    assert model.epochs == 25 and "time budget 2 min" in dashboard.summary.text()
    model.close()
    dashboard.stop_updates()


def finished_run_events(tmp_path, steps: int, epochs_done: int, epochs: int, reason: str | None):
    """A finished run's directory, from events as the trainer writes them."""
    import json

    from trainer.core.rundir import RunDir

    run = RunDir(tmp_path / "runs" / "early").create()
    layers = ["features.denseblock4.denselayer16.conv2.weight", "classifier.weight"]
    events = [{"event": "run_start", "config": {"train": {"epochs": epochs}, "monitor": {"histogram_every": 0}},
               "classes": ["a", "b"], "train_size": 10, "val_size": 2, "device": "cpu", "cache": "memory",
               "trainable": 10, "param_groups": [{"name": "default"}], "layers": layers, "time": 1.0}]
    events += [{"event": "grad_stats", "step": s, "grad_norm": [0.1, 0.2], "weight_norm": [1.0, 2.0],
                "update_ratio": [1e-3, 2e-3], "zero_frac": [0.0, 0.0]} for s in range(1, steps + 1)]
    events += [{"event": "step", "step": s, "epoch": 1, "batch": s, "batches": steps, "loss": 2.3 - 0.1 * s,
                "lr": [0.01], "images_per_s": 400.0 + s, "grad_norm": 1.5, "time": 1.0 + s} for s in range(1, steps + 1)]
    events += [{"event": "epoch", "epoch": e, "epochs": epochs, "val_acc": 0.5, "train_loss": 1.0, "val_loss": 1.0,
                "time": 10.0 + e} for e in range(1, epochs_done + 1)]
    events.append({"event": "run_end", "status": "completed", "message": "", "best_acc": 0.5,
                   "epochs_completed": epochs_done, "step": steps, "reason": reason, "time": 50.0})
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    run.write_status(state="completed", epoch=epochs_done, epochs=epochs)
    return run


def test_an_early_stop_reads_the_epochs_it_trained_and_one_step_draws_a_point(qtbot, make_window, tmp_path):
    run = finished_run_events(tmp_path, steps=1, epochs_done=11, epochs=14, reason="early_stop")
    window = make_window(runs_dir=tmp_path / "runs")
    window.run_actions.open(str(run.path))
    qtbot.waitUntil(lambda: window.run_model is not None and window.run_model.ended, timeout=10_000)
    assert window.status.progress.text() == "epoch 11/14 · stopped early", "not 14/14: the run stopped at 11"
    curves = window.dashboard.curves
    window.dashboard.tabs.setCurrentWidget(curves)
    drawn = ((curves.loss_plot, curves.raw_loss), (curves.speed_plot, curves.speed_curve),
             (curves.norm_plot, curves.norm_curve), (curves.lr_plot, curves.lr_curves[0]))
    qtbot.waitUntil(lambda: all(len(item.getData()[0] if item.getData()[0] is not None else []) == 1
                                for _, item in drawn), timeout=5_000)  # the timer redraws one step plot a tick
    for plot, item in drawn:
        (x,), (y,) = item.getData()
        assert item.opts["symbol"] is not None, f"{plot.plotItem.titleLabel.text}: one step is drawn as a dot"
        (x0, x1), (y0, y1) = plot.getViewBox().viewRange()
        assert x0 < x < x1 and y0 < y < y1, (plot.plotItem.titleLabel.text, (x, y), (x0, x1), (y0, y1))
        assert x1 - x0 < 10 and y1 - y0 < 10 * max(abs(y), 1e-3), "the view is around the point, not ±200"
    from app.widgets.plots import draw

    window.dashboard.tabs.setCurrentWidget(window.dashboard.gradients)
    gradients = window.dashboard.gradients
    qtbot.waitUntil(lambda: gradients.layer_table.rowCount() == 2, timeout=5_000)
    longest = "features.denseblock4.denselayer16.conv2.weight"
    table = gradients.layer_table  # a name longer than its column is cut in its middle, whole on hover
    assert longest in [table.item(r, 0).toolTip() for r in range(2)]
    assert table.textElideMode() == Qt.TextElideMode.ElideMiddle
    header = table.horizontalHeader()
    assert all(header.sectionViewportPosition(c) + header.sectionSize(c) <= table.viewport().width()
               for c in range(1, header.count())), "every figure in view"
    assert "off for this run" in gradients.hist_choice.placeholderText(), "not 'no histograms yet' when they are off"

    draw(curves.raw_loss, [1.0, 200.0], [2.2, 0.4])  # the second point: a line, and the view follows the data again
    assert curves.raw_loss.opts["symbol"] is None and all(curves.loss_plot.getViewBox().autoRangeEnabled())


def test_what_augment_auto_became_is_on_the_summary_with_its_reason(qtbot, tmp_path):

    from trainer.core.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    why = "the classes look like characters (digits or letters): mirrored, they are other symbols"
    start = {"event": "run_start", "config": {"train": {"epochs": 2}}, "classes": ["0", "1"], "train_size": 10,
             "val_size": 2, "device": "cpu", "cache": "memory", "trainable": 10, "param_groups": [], "layers": [],
             "augment": [{"key": "data.augment.hflip", "value": False, "why": why},
                         {"key": "data.augment.crop_scale_min", "value": 0.6, "why": "the usual"}], "time": 1.0}
    dashboard, model = dashboard_reading(qtbot, run, [start])
    text = dashboard.summary.text()
    assert "augmentation (auto): " in text and "flips off</span>" in text and "crops from 60%" in text
    assert f"title='{why}'" in text, "the trainer's reason on hover"
    model.close()
    dashboard.stop_updates()


def test_a_new_run_starts_with_empty_charts_and_says_it_is_preparing(qtbot, make_window, shapes_dir, tmp_path,
                                                                      monkeypatch):
    """Issue #71: a new run's empty charts kept the last run's axis ranges, and while a 10-epoch run prepared the
    status bar said "epoch 0/1"."""
    from helpers import write_config
    from test_main_window import wait_ready

    monkeypatch.setenv("TRAINDECK_STANDBY", "0")  # a trainer of its own, so that its preparing is seen
    old = finished_run_events(tmp_path, steps=30, epochs_done=3, epochs=3, reason=None)
    window = make_window(write_config(tmp_path, shapes_dir, train={"epochs": 7}), runs_dir=tmp_path / "runs")
    window.run_actions.open(str(old.path))
    curves = window.dashboard.curves
    window.dashboard.tabs.setCurrentWidget(curves)
    plots = ((curves.loss_plot, curves.raw_loss), (curves.speed_plot, curves.speed_curve),
             (curves.norm_plot, curves.norm_curve))

    def points(item) -> int:
        x, _ = item.getData()
        return 0 if x is None else len(x)

    qtbot.waitUntil(lambda: all(points(item) == 30 for _, item in plots), timeout=10_000)
    qtbot.waitUntil(lambda: all(plot.getViewBox().viewRange()[0][1] > 20 for plot, _ in plots), timeout=5_000)
    for plot in (curves.loss_plot, curves.epoch_plot, curves.lr_plot):  # the curves' names above them, not over them
        assert plot.getPlotItem().legend is None
    assert "━ raw" in curves.loss_plot.getAxis("bottom").labelString()
    assert "━ default" in curves.lr_plot.getAxis("bottom").labelString()
    window.dashboard.tabs.setCurrentWidget(window.dashboard.gradients)  # the heatmap's axis: steps, as the histogram's
    heat_axis = window.dashboard.gradients.heat_plot.getAxis("bottom")
    qtbot.waitUntil(lambda: heat_axis._tickLevels is not None, timeout=5_000)
    assert [label for _, label in heat_axis._tickLevels[0]] == ["1", "6", "11", "16", "21", "26"], "not 0-29"
    window.dashboard.tabs.setCurrentWidget(curves)
    if window.form.restore_button.isVisible():
        window.form.restore_button.click()  # the form as it was before the old run's settings came in
    wait_ready(qtbot, window)

    window.run_actions.start()
    assert window.status.progress.text() == "preparing · 7 epochs planned"
    for plot, item in plots:
        assert points(item) == 0
        assert plot.getViewBox().viewRange() == [[0, 1], [0, 1]], plot.plotItem.titleLabel.text
    assert window.dashboard.results.image.relabel_choice.count() == 0, "no class of the last run to relabel as"
    qtbot.waitUntil(lambda: bool(window.run_model.start_event), timeout=60_000)
    assert window.status.progress.text().startswith("epoch 0/7")
    qtbot.waitUntil(lambda: points(curves.raw_loss) > 0, timeout=60_000)
    drawn, _ = curves.raw_loss.getData()
    shown = curves.loss_plot.getViewBox().viewRange()[0]
    margin = 0.15 * (drawn.max() - drawn.min()) + 2  # pyqtgraph's padding at most (a lone point: 1 step each side)
    assert drawn.min() - margin <= shown[0] and shown[1] <= drawn.max() + margin, (
        "the new run's steps, not the old run's range", shown, drawn)
    window.runs.stop()
    qtbot.waitUntil(lambda: not window.runs.running, timeout=60_000)


def test_one_huge_epoch_loss_does_not_flatten_the_others_and_the_chart_says_so(qtbot, tmp_path):
    """Issue #71: epoch 1's validation loss of 966 flattened Loss per epoch."""
    import json

    run = finished_run_events(tmp_path, steps=3, epochs_done=6, epochs=6, reason=None)
    events = [json.loads(line) for line in run.events.read_text().splitlines()]
    for e in events:
        if e["event"] == "epoch":
            e["train_loss"], e["val_loss"] = 2.0 / e["epoch"], (966.0 if e["epoch"] == 1 else 1.5 / e["epoch"])
    dashboard, model = dashboard_reading(qtbot, run, events)
    curves = dashboard.curves
    curves.redraw()
    (_, _), (low, high) = curves.epoch_plot.getViewBox().viewRange()
    assert low <= 0.25 and 2.0 <= high < 5, "the other epochs' 0.25-2 fill the chart"
    assert "1 off the scale" in curves.epoch_plot.plotItem.titleLabel.text and "966 at epoch 1" in curves.epoch_plot.toolTip()
    dashboard.show()
    curves.epoch_plot.log_toggle.setChecked(True)  # a log axis shows every point: nothing is left out
    qtbot.waitUntil(lambda: curves.epoch_plot.getViewBox().viewRange()[1][1] >= 2.98, timeout=5_000)  # log10(966)
    assert "off the scale" not in curves.epoch_plot.plotItem.titleLabel.text
    model.close()
    dashboard.stop_updates()


def test_resume_after_a_stop_on_an_epochs_last_step_draws_that_epochs_real_loss(qtbot, make_window, shapes_dir,
                                                                                  tmp_path, monkeypatch):
    """Issue #71: stopped on the last step of an epoch, then resumed from the window, the run's Loss per epoch drew
    that epoch at 0.0 (a fake loss logged by the resumed segment)."""
    import numpy as np
    from helpers import train_here, write_config

    from trainer.train.loop import Loop

    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 2}, monitor={"log_every": 1})
    log_step = Loop.log_step

    def stop_on_the_first_epochs_last_step(self, window, result, batches, *rest):
        if self.state.epoch == 0 and self.state.batch_in_epoch == batches:
            self.stop.requested = True  # as Stop's file would, read at this log step
        return log_step(self, window, result, batches, *rest)

    monkeypatch.setattr(Loop, "log_step", stop_on_the_first_epochs_last_step)
    run, _ = train_here(cfg, tmp_path / "runs")
    monkeypatch.setattr(Loop, "log_step", log_step)
    assert run.read_status()["state"] == "stopped"
    window = make_window(cfg, runs_dir=tmp_path / "runs")
    window.run_actions.open(str(run.path))
    qtbot.waitUntil(lambda: window.run_model is not None and window.run_model.ended, timeout=10_000)
    window.run_actions.resume(str(run.path))  # Resume, as its button does: the trainer in its own process
    qtbot.waitUntil(lambda: window.run_model.state == "completed", timeout=120_000)
    losses = window.run_model.train_loss.y
    assert len(losses) == 2 and np.all(losses > 0.05), losses


def test_a_long_run_without_a_summary_opens_in_the_window_through_one_built_in_a_process(qtbot, make_window, tmp_path,
                                                                                           monkeypatch):
    """Issue #72: opening a finished run whose events have no summary (a run from before summaries, copied without
    one): `main.py summarize` builds it in a process of its own, then the dashboard reads it; what it shows is the
    whole file's run, thinned, and the GUI never holds every step."""
    from test_summary import assert_same_run, emit_steps, start, state_of

    from trainer.core import summary as summary_module
    from trainer.core.events import EventWriter
    from trainer.core.rundir import RunDir
    from trainer.core.summary import read_header

    run = RunDir(tmp_path / "runs" / "old-run").create()
    writer = EventWriter(run.events)
    start(writer)
    emit_steps(writer, 1, 20_000, spike=12_345)
    writer.emit("run_end", status="completed", message="", epochs_completed=40)
    writer.close()
    run.summary.unlink()
    run.write_status(state="completed", ended=1.0)
    monkeypatch.setattr(summary_module, "BUILD_ABOVE", 1 << 20)  # this run's 6 MB is a long one
    window = make_window(runs_dir=tmp_path / "runs")
    said: list[str] = []
    window.runs.stateText.connect(said.append)
    window.runs.open(run)
    assert any("without a summary; building it once" in text for text in said), said
    qtbot.waitUntil(lambda: window.run_model.ended and window.run_model.state == "completed", timeout=60_000)
    assert read_header(run.summary, run.events)["offset"] == run.events.stat().st_size
    model = window.run_model
    assert len(model.step_loss) <= 2 * summary_module.BUDGET["step"] + 2
    assert_same_run(model, state_of(run, summary=False))
    assert 12_345 in model.step_loss.x.tolist(), "the one-step spike is kept"


def test_a_long_curve_is_thinned_to_its_plots_width_and_keeps_its_peaks(qtbot, tmp_path):
    """20,000 steps on a plot some 300 px wide: drawn as POINTS_PER_PX points a pixel (each bucket's lowest and
    highest), not thousands more than a plot shows; the one spike and the lowest loss are still drawn."""
    import json

    from app.widgets.plots import POINTS_PER_PX

    run = finished_run_events(tmp_path, steps=20_000, epochs_done=1, epochs=1, reason=None)
    events = [json.loads(line) for line in run.events.read_text().splitlines()]
    for e in events:
        if e["event"] == "step":
            e["loss"] = 9.5 if e["step"] == 12_345 else 2.0 + 0.5 * ((e["step"] * 7919) % 101) / 101
    dashboard, model = dashboard_reading(qtbot, run, events)
    dashboard.resize(1280, 720)
    dashboard.show()
    qtbot.waitExposed(dashboard)
    dashboard.curves.redraw()
    raw = dashboard.curves.raw_loss
    width = raw.getViewBox().width()
    assert 150 < width < 600
    drawn = raw.getData()[1]
    assert 2 * width <= len(drawn) <= 1.1 * POINTS_PER_PX * width, "about POINTS_PER_PX a pixel (whole buckets)"
    assert drawn.max() == 9.5 and drawn.min() == min(e["loss"] for e in events if e["event"] == "step")
    model.close()
    dashboard.stop_updates()


def test_a_replay_updates_the_progress_a_few_times_a_second_not_once_an_event(qtbot, tmp_path):
    """Issue #72: replaying a run set the status bar's progress once per event (4,914 `setValue` calls, 1.3 s);
    now at most once every PROGRESS_MS of the replay, whatever its speed, the last value the run's end."""
    import time

    from app.jobs.run_controller import PROGRESS_MS, RunController
    from app.state.runs_folder import RunsFolder

    run = finished_run_events(tmp_path, steps=6_000, epochs_done=3, epochs=3, reason=None)
    controller = RunController(RunsFolder(tmp_path / "runs"))
    shown: list[float] = []
    controller.progressed.connect(lambda done, epochs, eta: shown.append(done))
    started = time.monotonic()
    controller.open(run)
    qtbot.waitUntil(lambda: controller.model is not None and controller.model.ended, timeout=60_000)
    qtbot.wait(2 * PROGRESS_MS)
    replay_s = time.monotonic() - started
    assert 1 <= len(shown) <= replay_s / (PROGRESS_MS / 1000) + 3, (len(shown), replay_s)
    assert len(shown) < 6_000 / 20
    controller.shutdown()
