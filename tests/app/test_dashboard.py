"""The dashboard's side panel: what a run says of itself while it goes."""

from helpers import read_all


def test_a_re_plan_is_a_line_on_the_dashboard_and_moves_the_epoch_counter(qtbot, tmp_path):
    import json

    from app.jobs.run_model import RunModel
    from app.training.dashboard import Dashboard
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
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    model = RunModel(run)
    dashboard.set_model(model)
    read_all(model)
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
    assert gradients.layer_table.columnWidth(0) >= gradients.layer_table.fontMetrics().horizontalAdvance(longest)
    assert "off for this run" in gradients.hist_choice.placeholderText(), "not 'no histograms yet' when they are off"

    draw(curves.raw_loss, [1.0, 200.0], [2.2, 0.4])  # the second point: a line, and the view follows the data again
    assert curves.raw_loss.opts["symbol"] is None and all(curves.loss_plot.getViewBox().autoRangeEnabled())


def test_what_augment_auto_became_is_on_the_summary_with_its_reason(qtbot, tmp_path):
    import json

    from app.jobs.run_model import RunModel
    from app.training.dashboard import Dashboard
    from trainer.core.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    why = "the classes look like characters (digits or letters): mirrored, they are other symbols"
    start = {"event": "run_start", "config": {"train": {"epochs": 2}}, "classes": ["0", "1"], "train_size": 10,
             "val_size": 2, "device": "cpu", "cache": "memory", "trainable": 10, "param_groups": [], "layers": [],
             "augment": [{"key": "data.augment.hflip", "value": False, "why": why},
                         {"key": "data.augment.crop_scale_min", "value": 0.6, "why": "the usual"}], "time": 1.0}
    run.events.write_text(json.dumps(start) + "\n")
    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    model = RunModel(run)
    dashboard.set_model(model)
    read_all(model)
    text = dashboard.summary.text()
    assert "augmentation (auto): " in text and "flips off</span>" in text and "crops from 60%" in text
    assert f"title='{why}'" in text, "the trainer's reason on hover"
    model.close()
    dashboard.stop_updates()
