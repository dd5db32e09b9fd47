"""The Runs page as a table of experiments: a column per differing hyper-parameter, filter and sort, the metric
against a hyper-parameter, parallel coordinates of a sweep, tags and notes; "Continue for N more epochs"."""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import train_here, write_config
from PySide6.QtCore import Qt

from app.state.experiments import read_notes, varying_keys
from trainer.core.config import RunConfig
from trainer.core.rundir import RunDir, new_run_dir


def fake_run(runs_dir, lr, batch, best, sweep=None, model="resnet18"):
    """A finished run as the trainer leaves it on disk (config and status), without training."""
    cfg = RunConfig.from_dict({"model": {"name": model}, "optimizer": {"lr": lr}, "data": {"batch_size": batch}})
    run = new_run_dir(runs_dir, model)
    run.config.write_text(yaml.safe_dump(cfg.to_dict()))
    now = time.time()
    run.write_status(state="completed", best_acc=best, val_acc=best - 0.01, epoch=10, started=now - 95, ended=now,
                     queue={"sweep": sweep, "values": {"optimizer.lr": lr}} if sweep else None)
    if not sweep:
        status = json.loads(run.status_file.read_text())
        status.pop("queue")
        run.status_file.write_text(json.dumps(status))
    return run


def test_the_runs_table_shows_what_differs_filters_sorts_and_plots(qtbot, tmp_path):
    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    for i, (lr, batch, best) in enumerate([(0.001, 32, 0.81), (0.01, 32, 0.92), (0.1, 64, 0.55), (0.003, 64, 0.88)]):
        fake_run(runs_dir, lr, batch, best, sweep="lrs" if i < 3 else None)
    page = RunsPage()
    qtbot.addWidget(page)
    page.resize(1200, 700)
    page.show()
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 4, timeout=10_000)
    headers = [page.model.headerData(c, Qt.Orientation.Horizontal) for c in range(page.model.columnCount())]
    assert "lr" in headers and "batch" in headers and "model" in headers
    assert page.model.params == ["data.batch_size", "optimizer.lr"]  # only what differs (not the model: all resnet18)
    assert "duration" in headers and "best val acc" in headers and "tags" in headers
    page.filter.setText("lr=0.01")
    assert page.proxy.rowCount() == 1 and page.shown_rows()[0]["params"]["optimizer.lr"] == 0.01
    page.filter.setText("")
    page.table.sortByColumn(headers.index("best val acc"), Qt.SortOrder.DescendingOrder)
    assert [r["best val acc"] for r in page.shown_rows()] == [0.92, 0.88, 0.81, 0.55]
    assert page.proxy.index(0, headers.index("duration")).data() == "1m35s"
    views = page.views
    assert views.scatter_x.currentText() == "optimizer.lr", "the swept key first, not the first column"
    assert views.scatter_log_x, "learning rates 0.001..0.1 on a log axis"
    (points,) = views.scatter_plot.listDataItems()
    assert sorted(points.data["x"]) == pytest.approx([-3, -2.5229, -2, -1], abs=1e-3)
    labels = [label for level in views.scatter_plot.getAxis("bottom")._tickLevels for _, label in level]
    assert labels == ["0.001", "0.003", "0.01", "0.1"], "each run's own value labelled"
    scatter = [i for i in views.scatter_plot.listDataItems()]
    assert len(scatter) == 1 and len(scatter[0].data) == 4
    views.sweep_choice.setCurrentText("lrs")
    lines = sum(int(np.isnan(item.yData).sum()) for item in views.parallel_plot.listDataItems())
    assert lines == 3  # one line per run of the sweep (NaN-separated within colour bands)
    tags = {r["params"]["optimizer.lr"]: r["tags"] for r in page.model.rows}
    assert tags == {0.001: ["lrs"], 0.01: ["lrs"], 0.1: ["lrs"], 0.003: []}, "the sweep is a tag of its runs alone"


def test_a_model_that_differs_between_runs_has_one_column(qtbot, tmp_path):
    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    fake_run(runs_dir, 0.01, 32, 0.8, model="resnet18")
    fake_run(runs_dir, 0.01, 32, 0.7, model="small_cnn")
    page = RunsPage()
    qtbot.addWidget(page)
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 2, timeout=10_000)
    headers = [page.model.headerData(c, Qt.Orientation.Horizontal) for c in range(page.model.columnCount())]
    assert headers.count("model") == 1 and "model.name" in page.model.params, headers  # still a key to plot against


def test_tags_and_notes_are_kept_beside_the_run(qtbot, tmp_path):
    from app.dialogs.run_dialogs import NotesDialog

    run = fake_run(tmp_path / "runs", 0.01, 32, 0.9)
    dialog = NotesDialog(run)
    qtbot.addWidget(dialog)
    dialog.tags.setText("baseline, night")
    dialog.notes.setPlainText("augmentation off")
    dialog.accept()
    assert read_notes(RunDir(run.path)) == {"tags": ["baseline", "night"], "notes": "augmentation off"}


def test_varying_keys_ignore_paths_and_keep_config_order():
    rows = [{"params": {"data.train_dir": "/a", "optimizer.lr": 0.1, "model.name": "x"}},
            {"params": {"data.train_dir": "/b", "optimizer.lr": 0.2, "model.name": "x"}}]
    assert varying_keys(rows) == ["optimizer.lr"] and varying_keys(rows[:1]) == []


@pytest.mark.slow
def test_continue_for_more_epochs_shows_the_schedule_rule_and_extends(qtbot, make_window, shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    run, code = train_here(cfg, tmp_path / "runs")
    assert code == 0
    window = make_window(cfg, runs_dir=tmp_path / "runs")
    window.run_actions.open(str(run.path))  # on the dashboard, ended: Continue must make it follow again
    qtbot.waitUntil(lambda: window.run_model.ended, timeout=10_000)
    window.run_actions.extend(str(run.path))
    qtbot.waitUntil(lambda: window.run_actions.extend_dialog is not None, timeout=20_000)
    dialog = window.run_actions.extend_dialog
    dialog.more.setValue(2)
    assert "cosine schedule recomputed for 3 epochs and continued at epoch 2" in dialog.rule.text()
    dialog.accept()
    qtbot.waitUntil(lambda: window.run_model.segments == 2 and window.run_model.state == "completed", timeout=120_000)
    model = window.run_model
    assert RunDir(run.path).read_status().get("epoch") == 3
    assert [e["epoch"] for e in model.epoch_events] == [1, 2, 3] and model.epochs == 3
    assert np.all(np.diff(model.step_loss.x) > 0)
    assert window.status.progress.value() == window.status.progress.maximum() == 3, "the counter counts the run's 3 epochs"


def test_the_runs_and_queue_pages_follow_status_changes_by_themselves(qtbot, tmp_path):
    """A queued run that starts shows as running on the Runs page without Refresh; the Queue page shows progress
    and accuracy, and double-clicking a run asks to watch it."""
    from app.pages.queue_page import QueuePage
    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    run = fake_run(runs_dir, 0.01, 32, 0.5, sweep="s")
    run.write_status(state="queued", queue={"sweep": "s", "values": {}, "position": 1, "added": time.time()})
    page = RunsPage()
    qtbot.addWidget(page)
    page.show()
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: [r["status"] for r in page.rows] == ["queued"], timeout=10_000)
    run.write_status(state="running", epoch=2, epochs=10, best_acc=0.625, pid=os.getpid())
    qtbot.waitUntil(lambda: [r["status"] for r in page.rows] == ["running"], timeout=10_000)  # no refresh()
    page.hide()

    queue_page = QueuePage()
    qtbot.addWidget(queue_page)
    queue_page.set_runs_dir(runs_dir)
    queue_page.show()
    qtbot.waitUntil(lambda: bool(queue_page.rows), timeout=10_000)
    row = queue_page.rows[0]
    assert row["progress"] == "epoch 2/10" and row["best val acc"] == "62.5%"
    with qtbot.waitSignal(queue_page.openRequested, timeout=2_000) as asked:
        queue_page.table.cellDoubleClicked.emit(0, 1)
    assert asked.args == [str(run.path)]
    queue_page.hide()


def test_compared_runs_are_labelled_by_what_differs_not_by_their_long_names(qtbot, tmp_path):
    from app.pages.run_views import legend_label
    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    a = fake_run(runs_dir, 0.01, 32, 0.8)
    b = fake_run(runs_dir, 0.1, 32, 0.7)
    page = RunsPage()
    qtbot.addWidget(page)
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 2, timeout=10_000)
    assert legend_label("20261201-101500-resnet18") == "10:15:00 resnet18", "short: the day goes"
    assert legend_label(a.name) != legend_label(b.name)
    tip = page.views.compare_tooltip([a.name, b.name]).splitlines()
    assert tip == [f"{legend_label(a.name)}: lr=0.01", f"{legend_label(b.name)}: lr=0.1"]


def test_the_runs_table_leads_with_test_accuracy_readable_groups_and_the_whole_duration(tmp_path):
    """Test accuracy where evaluated, parameter groups as people say them, duration over every segment from the
    first start (a resumed run showed its last segment only)."""
    from app.pages.run_views import legend_label
    from app.state.experiments import summarize
    from trainer.runs.runner import earlier_seconds

    runs_dir = tmp_path / "runs"
    run = fake_run(runs_dir, 0.01, 32, 0.9)
    raw = yaml.safe_load(run.config.read_text())
    raw["optimizer"]["groups"] = [{"pattern": "fc", "lr": 1e-3}, {"pattern": "layer4.*", "lr": 1e-4, "weight_decay": 0},
                                  {"pattern": "conv1", "freeze": True}]
    run.config.write_text(yaml.safe_dump(raw))
    first = run.read_status()
    # a second launch (resume) as the runner records it: the first segment's time carried, the first start kept
    earlier = earlier_seconds(first)
    assert earlier == pytest.approx(95, abs=1)
    run.write_status(first_started=first["started"], earlier_s=earlier, started=first["ended"] + 600,
                     ended=first["ended"] + 660, test_acc=0.875)
    row = summarize(run)
    assert row["test acc"] == 0.875
    assert row["params"]["optimizer.groups"] == "fc 0.001, layer4.* 0.0001 wd 0, conv1 frozen"
    assert row["duration"] == pytest.approx(95 + 60, abs=1), "both segments, not the idle time between them"
    assert row["started_ts"] == first["started"]
    assert legend_label("20261202-101500-resnet18-a-very-long-name-indeed") == "10:15:00 re…-name-indeed"


def test_two_runs_of_one_folder_show_what_their_manifests_changed(qtbot, tmp_path):
    """The Runs page's data changes column: each run's own manifest (excluded, relabelled, added), shown where it
    differs between the runs; a run without a manifest changed nothing."""
    from app.pages.runs_page import RunsPage
    from trainer.data.manifest import Manifest, write_manifest

    runs_dir = tmp_path / "runs"
    before = fake_run(runs_dir, 0.01, 32, 0.8)
    after = fake_run(runs_dir, 0.01, 32, 0.85)
    changes = Manifest(after.manifest, [str(tmp_path / "a.png")], {str(tmp_path / "b.png"): "cat"},
                       {str(tmp_path / f"pool/{i}.png"): "dog" for i in range(20)})
    write_manifest(changes)
    page = RunsPage()
    qtbot.addWidget(page)
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 2, timeout=10_000)
    column = page.model.columns.index("data changes")
    shown = {page.model.rows[r]["path"]: page.model.data(page.model.index(r, column)) for r in range(2)}
    assert shown == {str(before.path): "none", str(after.path): "−1 excluded, 1 relabelled, +20 added"}


def test_compare_reads_a_long_run_as_a_stream_and_draws_a_bounded_curve(tmp_path):
    """Compare of a 10^5-step run (issue #50): at most COMPARE_POINTS points to draw, the first and last steps and a
    one-step spike among them, every epoch's accuracy."""
    from app.pages.runs_page import COMPARE_POINTS, load_curves

    run = tmp_path / "20261203-101500-long"
    run.mkdir()
    steps = 100_000
    with open(run / "events.jsonl", "w") as f:
        f.write('{"event": "run_start", "step": 0}\n')
        for step in range(1, steps + 1):
            loss = 50.0 if step == 54_321 else 2.0 / (1 + step / 1000)
            f.write(f'{{"event": "step", "step": {step}, "loss": {loss}, "lr": [0.1]}}\n')
            if step % 10_000 == 0:
                f.write(f'{{"event": "epoch", "epoch": {step // 10_000}, "val_acc": {step / steps}}}\n')
    ((name, curves),) = load_curves([str(run)])
    xs, ys = zip(*curves["steps"])
    assert name == run.name and len(xs) <= COMPARE_POINTS
    assert xs[0] == 1 and xs[-1] == steps and list(xs) == sorted(xs)
    assert max(ys) == 50.0 and xs[ys.index(50.0)] == 54_321, "the spike is drawn where it was"
    assert curves["epochs"] == [(e, e / 10) for e in range(1, 11)]


def test_a_run_s_status_change_updates_its_row_alone_and_reads_only_that_run(qtbot, tmp_path, monkeypatch):
    """The Runs page following its runs (issue #50): one run of many changes state; only that run is read again
    (the others' rows are kept until their files change), its row shows the new state, the table is not rebuilt
    (no model reset: 1,000 rows re-sorted on the GUI thread at every change), and a new run is added as a row."""
    import app.state.experiments as experiments
    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    runs = [fake_run(runs_dir, lr, 32, 0.5 + lr) for lr in (0.001, 0.003, 0.01, 0.03, 0.1)]
    read = []
    summarize = experiments.summarize
    monkeypatch.setattr(experiments, "summarize", lambda run: read.append(run.name) or summarize(run))
    page = RunsPage()
    qtbot.addWidget(page)
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 5 and not page._reading, timeout=10_000)
    assert sorted(read) == sorted(r.name for r in runs)
    resets = []
    page.model.modelReset.connect(lambda: resets.append(1))
    read.clear()
    runs[2].write_status(state="failed", message="out of memory")
    page._check_changes()
    status = page.model.columns.index("status")
    row = next(i for i, r in enumerate(page.model.rows) if r["path"] == str(runs[2].path))
    qtbot.waitUntil(lambda: page.model.data(page.model.index(row, status)) == "failed", timeout=10_000)
    assert read == [runs[2].name] and not resets
    newer = fake_run(runs_dir, 0.01, 32, 0.99)
    page.refresh()
    qtbot.waitUntil(lambda: len(page.rows) == 6, timeout=10_000)
    assert not resets and str(newer.path) in {r["path"] for r in page.rows}
    from trainer.data.manifest import Manifest, write_manifest

    read.clear()
    write_manifest(Manifest(runs[1].manifest, [str(tmp_path / "a.png")], {}, {}))  # the run's own exclude.yaml
    page.refresh()
    qtbot.waitUntil(lambda: any(r["path"] == str(runs[1].path) and r["params"]["data changes"].startswith("−1")
                                for r in page.rows), timeout=10_000)
    assert read == [runs[1].name], "a run's manifest changing reads that run again, and it alone"


def written_run(path, r: int, steps: int, epoch_every: int = 0) -> RunDir:
    """A run as the trainer's event writer leaves it (with its summary): `steps` steps of a falling loss offset by
    `r`, an epoch's accuracy every `epoch_every` steps (else one epoch at the end)."""
    from trainer.core.events import EventWriter

    run = RunDir(path).create()
    writer = EventWriter(run.events)
    for step in range(1, steps + 1):
        writer.emit("step", step=step, loss=2.0 / (1 + step / 1000) + r, lr=[0.1])
        if epoch_every and step % epoch_every == 0:
            writer.emit("epoch", epoch=step // epoch_every, val_acc=step / steps)
    if not epoch_every:
        writer.emit("epoch", epoch=1, val_acc=0.5 + r / 10)
    writer.close()
    return run


def test_compare_of_runs_with_summaries_draws_each_run_bounded(qtbot, tmp_path):
    """Compare (the selected runs) on runs the trainer's event writer wrote (with their summaries): every run drawn, one a turn,
    each within COMPARE_POINTS, their accuracy per epoch in full."""
    from app.pages.runs_page import COMPARE_POINTS, RunsPage, load_curves

    paths = []
    for r in range(3):
        run = written_run(tmp_path / f"2026120{r}-run", r, 20_000, epoch_every=5000)
        paths.append(str(run.path))
    curves = load_curves(paths)
    page = RunsPage()
    qtbot.addWidget(page)
    page.views.show_compare(curves)
    qtbot.waitUntil(lambda: not page.views.compare_pending, timeout=10_000)
    drawn = page.views.compare_loss.listDataItems()
    assert len(drawn) == 3 and all(len(item.xData) <= COMPARE_POINTS for item in drawn)
    assert sorted(item.yData.min() for item in drawn) == pytest.approx([2 / 21, 1 + 2 / 21, 2 + 2 / 21])
    assert [c["epochs"] for _, c in curves] == [[(e, e / 4) for e in range(1, 5)]] * 3


def test_a_big_scan_runs_with_the_garbage_collector_paused_and_freezes_what_it_built():
    """The Dataset page's scan of 100,000 images: no cyclic collection while it runs (each held the interpreter
    lock, and the GUI thread, up to 0.2 s); jobs nested or at once share the switch, which is on again after."""
    import gc
    import threading

    from app.jobs.background import without_collection_pauses

    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def other_job():
        with without_collection_pauses():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other_job)
    thread.start()
    inside.wait(10)
    frozen = gc.get_freeze_count()
    with without_collection_pauses():
        built = [[i] for i in range(1000)]
        assert not gc.isenabled()
    assert not gc.isenabled(), "the other job is still running"
    release.set()
    thread.join()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(built)


def test_the_mlflow_button_goes_to_the_selected_run_s_page_on_its_tracking_server(qtbot, tmp_path, monkeypatch):
    """A run that logs to an MLflow tracking server (RUN/mlflow.json, written by the trainer's sink) has its page
    there one click away; a run logging to a store no server shows (sqlite:), or to none, has the button off."""
    from PySide6.QtGui import QDesktopServices

    from app.pages.runs_page import RunsPage

    runs_dir = tmp_path / "runs"
    served, stored = fake_run(runs_dir, 0.01, 32, 0.9), fake_run(runs_dir, 0.1, 32, 0.5)
    fake_run(runs_dir, 0.001, 32, 0.7)
    served.mlflow.write_text(json.dumps({"tracking_uri": "http://127.0.0.1:5000/", "experiment_id": "3",
                                         "run_id": "ab12"}))
    stored.mlflow.write_text(json.dumps({"tracking_uri": "sqlite:///mlflow.db", "experiment_id": "1", "run_id": "x"}))
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    page = RunsPage()
    qtbot.addWidget(page)
    page.set_runs_dir(runs_dir)
    qtbot.waitUntil(lambda: len(page.rows) == 3, timeout=10_000)
    states = {}
    for row in range(3):
        page.table.selectRow(row)
        states[page.selected()[0]] = page.mlflow_button.isEnabled()
        if page.selected()[0] == str(served.path):
            page.mlflow_button.click()
    assert states == {str(served.path): True, str(stored.path): False, str(runs_dir / sorted(
        p.name for p in runs_dir.iterdir() if p.name not in (served.name, stored.name))[0]): False}
    assert opened == ["http://127.0.0.1:5000/#/experiments/3/runs/ab12"]


def test_compare_of_long_runs_without_summaries_has_them_built_in_a_process_first(qtbot, tmp_path, monkeypatch):
    """Issue #72: Compare of runs with no summary (10 such runs held the interpreter lock for 112 s while a thread
    parsed them): `main.py summarize` builds each one's first, processes side by side, the page says so meanwhile, and
    the thread then reads the summaries only; every run is drawn, bounded."""
    import app.pages.runs_page as runs_page
    from trainer.core import summary as summary_module
    from trainer.core.summary import read_header

    monkeypatch.setattr(summary_module, "BUILD_ABOVE", 256 << 10)
    paths = []
    for r in range(2):
        run = written_run(tmp_path / f"2026120{r}-old", r, 12_000)
        run.summary.unlink()
        run.write_status(state="completed", ended=1.0)
        paths.append(str(run.path))
    unbuilt_when_read = []
    load_curves = runs_page.load_curves
    monkeypatch.setattr(runs_page, "load_curves", lambda ps: unbuilt_when_read.extend(
        p for p in ps if summary_module.needs_building(Path(p) / "events.jsonl")) or load_curves(ps))
    page = runs_page.RunsPage()
    qtbot.addWidget(page)
    monkeypatch.setattr(page, "selected", lambda: paths)
    page._compare()
    assert "building the summaries of 2 long run(s) first" in page.views.compare_loss.getPlotItem().titleLabel.text
    qtbot.waitUntil(lambda: len(page.views.compare_loss.listDataItems()) == 2 and not page.views.compare_pending,
                    timeout=60_000)
    assert unbuilt_when_read == [] and all(read_header(RunDir(p).summary, RunDir(p).events) for p in paths)
    assert all(len(item.xData) <= runs_page.COMPARE_POINTS for item in page.views.compare_loss.listDataItems())
    assert "building" not in page.views.compare_loss.getPlotItem().titleLabel.text
