"""What the app refuses, and what the trainer refuses for it: a group the frozen backbone leaves empty is shown
before Start; a config the trainer's pre-flight refuses leaves no run directory and its reason is shown."""

import pytest
from helpers import write_config

from trainer.core.rundir import list_runs


@pytest.mark.slow
def test_the_editor_asks_the_trainer_s_rule_and_a_refused_start_leaves_nothing(qtbot, make_window, shapes_dir,
                                                                              tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    runs = tmp_path / "runs"
    cfg = write_config(tmp_path, shapes_dir, model={"name": "resnet18"})
    window = make_window(cfg, runs)
    qtbot.waitUntil(lambda: window.device_page.probe is not None and bool(window.model_page.parameters)
                    and window.optimizer_page.head == "fc", timeout=60_000)
    window.optimizer_page.groups.add_group({"pattern": "layer4", "lr": 0.01})
    qtbot.waitUntil(lambda: window.start_action.isEnabled(), timeout=30_000)
    window.binder.widgets["model.freeze_backbone"].setChecked(True)  # now layer4 does not train
    qtbot.waitUntil(lambda: "groups[0].pattern: 'layer4' matches only backbone" in window.status.problem_label.text(),
                    timeout=10_000)
    assert not window.start_action.isEnabled()

    window.binder.widgets["model.freeze_backbone"].setChecked(False)
    not_weights = tmp_path / "weights.pt"
    not_weights.write_bytes(b"not a checkpoint")  # exists (the form is happy); the trainer's pre-flight is not
    window.binder.widgets["model.weights"].setCurrentText(str(not_weights))
    qtbot.waitUntil(lambda: window.start_action.isEnabled(), timeout=30_000)
    window.start_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.ended, timeout=60_000)
    assert window.run_model.state == "failed" and str(not_weights) in window.run_model.message
    assert str(not_weights) in window.status.state_label.text()
    assert list_runs(runs) == [] and not window.run_model.run.path.exists()
    assert not any((runs / ".pending").iterdir()), "the pending config and output are gone"
    assert not window.resume_action.isEnabled()


def test_auto_waits_for_a_folder_it_can_train_on(qtbot, make_window, shapes_dir, tmp_path, monkeypatch):
    """On an empty folder Auto's button took ~25 s to refuse: it is off, saying why, until the folder has classes."""
    monkeypatch.setenv("TRAINDECK_STANDBY", "0")
    empty = tmp_path / "empty"
    empty.mkdir()
    window = make_window(write_config(tmp_path, empty))
    button = window.dataset_page.auto.button
    qtbot.waitUntil(lambda: not button.isEnabled(), timeout=30_000)
    assert "no class sub-folders" in button.toolTip()
    window.binder.widgets["data.train_dir"].setText(str(shapes_dir))
    qtbot.waitUntil(lambda: button.isEnabled(), timeout=30_000)
    assert button.toolTip() == ""
