"""The Auto button (issue #24): one click plans in a subprocess, shows every choice, loads it into the forms and
trains it with Auto's budget; the budget stays with that run."""

import json

import pytest
from helpers import write_config


@pytest.mark.slow
def test_the_auto_button_plans_shows_every_choice_trains_and_its_budget_stays_with_that_run(
        qtbot, make_window, shapes_dir, tmp_path, torch_home, simulated):
    """One click: the plan made in a subprocess, every choice shown with its reason and loaded into the forms, the
    run started with Auto's budget. Stopped once it trains (Auto spending its whole budget, then testing and
    exporting, is tests/test_auto.py's end-to-end run), the next run the user starts has no budget."""
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
    # every candidate the plan weighed, with the epochs it would train, the chosen one marked; no weights offered
    # for images this small
    chosen_row = shown["candidate (chosen)"]
    assert chosen_row[0] == f"{shown['model.name'][0]} @ {shown['data.image_size'][0]} px"
    assert " epochs in the budget at " in chosen_row[1] and "measured" in chosen_row[1]
    assert panel.offer_box.isHidden()
    # the forms hold what Auto chose: an ordinary config to edit and start again
    assert str(window.binder.widgets["data.image_size"].value()) == shown["data.image_size"][0]
    assert window.binder.widgets["model.name"].currentText() == shown["model.name"][0]
    qtbot.waitUntil(lambda: window.run_model is not None and bool(window.run_model.start_event), timeout=30_000)
    run = window.run_model.run
    planned = json.loads(run.auto_choices.read_text())
    choices = {c["key"]: c["value"] for c in planned["choices"]}
    assert str(choices["model.name"]) == shown["model.name"][0]
    trained = window.run_model.start_event["config"]
    assert trained["train"]["budget"] == choices["train.budget"] > 0, "the run has Auto's budget"
    assert trained["model"]["name"] == choices["model.name"] and trained["train"]["epochs"] == choices["train.epochs"]
    qtbot.waitUntil(lambda: len(window.run_model.step_loss) > 0, timeout=60_000)
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: window.run_model.ended, timeout=60_000)
    assert run.read_status()["state"] == "stopped" and panel.button.isEnabled()

    # the plan stays in the forms, marked as Auto's on the Advanced page, but its budget was that run's
    advanced = window.advanced_page
    assert window.model.get("train.budget") == 0 and window.status.budget_label.text() == ""
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
    advanced.table.item(advanced._rows["train.budget"], 1).setText("2.5")  # typed into the Advanced page
    window.form.validate()
    assert window.status.budget_label.text() == "budget 2.5 min" and "2.5 min" in window.start_action.toolTip()


@pytest.mark.slow
def test_auto_refuses_without_a_folder_or_with_a_missing_one_and_says_why(qtbot, make_window, shapes_dir, tmp_path):
    window = make_window(write_config(tmp_path, shapes_dir))
    window.binder.widgets["data.train_dir"].setText("")
    assert window.planning.auto_plan(1.0) is None
    assert "choose a folder" in window.dataset_page.auto.status.text()
    window.binder.widgets["data.train_dir"].setText(str(tmp_path / "nowhere"))
    job = window.planning.auto_plan(1.0)
    qtbot.waitUntil(lambda: window.planning.auto_job is None, timeout=30_000)
    assert job is not None and "no such folder" in window.dataset_page.auto.status.text()
    assert not (tmp_path / "runs").exists()
    button = window.dataset_page.auto.button  # and the folder's scan turns Auto off until there is a folder to plan for
    qtbot.waitUntil(lambda: not button.isEnabled() and "nowhere" in button.toolTip(), timeout=10_000)


def test_the_offered_weights_download_with_progress_and_cancel_leaves_nothing(qtbot, make_window, shapes_dir,
                                                                               tmp_path, torch_home, monkeypatch):
    """The Auto box's offer of ImageNet weights (as a plan for photographs gives it): Download runs `main.py
    fetch-weights` against a mirror (a local server, slow), the bar shows the megabytes as they come, Cancel stops it
    and nothing is left in the cache."""
    import http.server
    import threading

    from test_pretrained import RESNET18_FILE, SlowHandler

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mirror = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("TRAINDECK_WEIGHTS_MIRROR", mirror)
    window = make_window(write_config(tmp_path, shapes_dir))
    panel = window.dataset_page.auto
    panel.show_offer({"model": "resnet18", "weights": "DEFAULT", "megabytes": 44.661, "url": f"{mirror}/x",
                      "why": "the images look like photographs"})
    assert not panel.offer_box.isHidden() and "44.7 MB" in panel.download.text()
    try:
        panel.download.click()
        qtbot.waitUntil(lambda: panel.download_progress.isVisible() and panel.download_progress.value() >= 2,
                        timeout=60_000)
        assert panel.download_progress.maximum() == 47 and not panel.download.isEnabled()
        cache = torch_home / "hub" / "checkpoints"
        assert list(cache.glob(".*.part")), "the download is being written"
        panel.cancel_download.click()
        assert "cancelled" in panel.offer_text.text() and panel.download.isEnabled()
        qtbot.waitUntil(lambda: not list(cache.iterdir()), timeout=10_000)  # the partial file removed by the command
    finally:
        server.shutdown()
        server.server_close()
    assert not (cache / RESNET18_FILE).exists()
