"""The Auto button (issue #24): one click plans in a subprocess, shows every choice, loads it into the forms and
trains it; the run ends within the budget with its test set evaluated and its ONNX export."""

import json

import pytest
from helpers import write_config

from trainer.core.events import read_events


@pytest.mark.slow
def test_the_auto_button_plans_shows_every_choice_and_trains_within_the_budget(qtbot, make_window, shapes_dir,
                                                                               tmp_path, torch_home):
    # torch_home: no pretrained weights, so from scratch, quick to probe
    window = make_window(write_config(tmp_path, shapes_dir))
    qtbot.waitUntil(lambda: window.dataset_page.scan_result is not None, timeout=30_000)
    panel = window.dataset_page.auto
    panel.minutes.setValue(0.5)
    panel.button.click()
    assert not panel.button.isEnabled() and panel.status.text().startswith("Planning")
    qtbot.waitUntil(lambda: not panel.choices.isHidden() or panel.button.isEnabled(), timeout=60_000)
    assert not panel.choices.isHidden(), panel.status.text()
    shown = {panel.choices.item(i, 0).text(): (panel.choices.item(i, 1).text(), panel.choices.item(i, 2).text())
             for i in range(panel.choices.rowCount())}
    assert {"model.name", "data.image_size", "optimizer.lr", "train.epochs", "train.budget"} <= shown.keys()
    assert all(why for _, why in shown.values())
    # the forms hold what Auto chose: an ordinary config to edit and start again
    assert str(window.binder.widgets["data.image_size"].value()) == shown["data.image_size"][0]
    assert window.binder.widgets["model.name"].currentText() == shown["model.name"][0]
    qtbot.waitUntil(lambda: window.run_model is not None and window.run_model.run.path.exists(), timeout=30_000)
    run = window.run_model.run
    qtbot.waitUntil(lambda: window.run_model.state == "completed", timeout=90_000)
    events = read_events(run.events)
    # the budget, through the trainer's own clock: planning's recorded share plus the budget it handed the trainer
    # make the 30 s, and no step was begun after the trainer's budget ran out (a step past it cuts the epoch short)
    planned = json.loads(run.auto_choices.read_text())
    budget_s = 60 * next(float(c["value"]) for c in planned["choices"] if c["key"] == "train.budget")
    first = events[0]["time"]
    steps = [e["time"] for e in events if e["event"] == "step"]
    log_interval = max(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else 0
    assert steps[-1] - first <= budget_s + log_interval, (steps[-1] - first, budget_s)
    assert len(window.run_model.step_loss) > 0
    choices = planned["choices"]
    assert {c["key"]: str(c["value"]) for c in choices}["model.name"] == shown["model.name"][0]
    kinds = {e["event"] for e in events}
    assert {"test", "export"} <= kinds
    assert (run.path / "exports" / "model.onnx").stat().st_size > 0
    assert (run.path / "eval" / "test" / "metrics.json").exists()
    assert panel.button.isEnabled()

    # the plan stays in the forms, marked as Auto's on the Advanced page, but its budget was that run's
    advanced = window.advanced_page
    assert advanced.value("train.budget") == 0 and window.budget_label.text() == ""
    marked = {key for key, who in advanced.set_by.items() if who == "Auto's plan"}
    assert "eval.tta" in marked or "train.ema" in marked or "train.early_stop.patience" in marked, advanced.set_by
    assert "budget" not in window.start_action.toolTip()
    # a manual run after it: no budget unless the user sets one, and one set shows before Start
    window.binder.widgets["train.epochs"].setValue(1)
    qtbot.waitUntil(window.start_action.isEnabled, timeout=30_000)  # the Auto run's process has exited
    window.start_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.run != run and bool(window.run_model.start_event), timeout=60_000)
    assert window.run_model.start_event["config"]["train"]["budget"] == 0
    qtbot.waitUntil(lambda: window.run_model.ended, timeout=60_000)
    advanced.set_value("train.budget", 2.5)
    window.validate()
    assert window.budget_label.text() == "budget 2.5 min" and "2.5 min" in window.start_action.toolTip()


def test_auto_refuses_without_a_folder_or_with_a_missing_one_and_says_why(qtbot, make_window, shapes_dir, tmp_path):
    window = make_window(write_config(tmp_path, shapes_dir))
    window.binder.widgets["data.train_dir"].setText("")
    assert window.auto_plan(1.0) is None
    assert "choose a folder" in window.dataset_page.auto.status.text()
    window.binder.widgets["data.train_dir"].setText(str(tmp_path / "nowhere"))
    job = window.auto_plan(1.0)
    qtbot.waitUntil(lambda: window.auto_job is None, timeout=30_000)
    assert job is not None and "no such folder" in window.dataset_page.auto.status.text()
    assert window.dataset_page.auto.button.isEnabled() and not (tmp_path / "runs").exists()
