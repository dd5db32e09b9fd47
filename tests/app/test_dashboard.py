"""The dashboard's side panel: what a run says of itself while it goes."""

def test_a_re_plan_is_a_line_on_the_dashboard_and_moves_the_epoch_counter(qtbot, tmp_path):
    import json

    from app.pages.dashboard import Dashboard
    from app.run_model import RunModel
    from trainer.core.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    events = [{"event": "run_start", "config": {"train": {"epochs": 12, "budget": 2.0}}, "classes": ["a", "b"],
               "train_size": 10, "val_size": 2, "device": "cpu", "cache": "memory", "trainable": 10,
               "param_groups": [{"name": "default"}], "layers": [], "time": 1.0},
              {"event": "epoch", "epoch": 1, "val_acc": 0.5, "time": 2.0},
              {"event": "replan", "epoch": 1, "old_epochs": 12, "epochs": 31, "epoch_s": 2.5, "budget_left_s": 80,
               "why": "2.5 s per epoch measured, 80 s of the budget left: faster than planned", "time": 2.1}]
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    model = RunModel(run)
    dashboard.set_model(model)
    model.poll()
    lines = [dashboard.warnings.item(i).text() for i in range(dashboard.warnings.count())]
    assert any("re-planned: 12 → 31 epochs" in line and "faster than planned" in line for line in lines), lines
    assert model.epochs == 31 and "time budget 2 min" in dashboard.summary.text()
    model.close()
    dashboard.stop_updates()
