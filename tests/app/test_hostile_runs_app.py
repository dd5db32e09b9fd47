"""What the window does with a run that names code or whose own files are damaged (issue #67): Try it on a run that
names a `.py` file runs nothing and says how to trust it; a damaged run is listed as damaged, opens without a hang,
and cannot be resumed."""

import json
import os
import shutil
import time

from faults.test_named_code import planted  # noqa: F401 - the fixture: a run and exports naming evil/net.py
from helpers import train_here, write_config

from trainer.core.rundir import RunDir


def test_try_it_on_a_run_that_names_code_runs_nothing(qtbot, make_window, planted, tmp_path):  # noqa: F811
    run, _, image, marker, spec = planted
    copy = shutil.copytree(run, tmp_path / "runs" / run.name, symlinks=True)
    window = make_window(write_config(tmp_path, image.parent.parent), runs_dir=tmp_path / "runs")
    dialog = window.run_actions.try_it()
    dialog.set_model_source(str(copy))
    dialog.classify([str(image)])
    qtbot.waitUntil(lambda: "runs no code that a file names" in dialog.status.text(), timeout=60_000)
    assert "--model-code" in dialog.status.text() and not marker.exists()
    dialog.close()


def test_a_damaged_run_is_listed_as_damaged_and_opens_without_a_hang(qtbot, make_window, shapes_dir, tmp_path):
    runs = tmp_path / "runs"
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    good, code = train_here(cfg, runs)
    assert code == 0
    fifo = RunDir(shutil.copytree(good.path, runs / "fifo-status"))
    fifo.status_file.unlink()
    os.mkfifo(fifo.status_file)
    listed = RunDir(shutil.copytree(good.path, runs / "list-status"))
    listed.status_file.write_text(json.dumps([1, 2, 3]))
    window = make_window(cfg, runs_dir=runs)
    page = window.runs_page
    page.set_runs_dir(runs)
    qtbot.waitUntil(lambda: len(page.rows) == 3, timeout=30_000)
    status = {row["run"]: row["status"] for row in page.rows}
    assert status == {good.name: "completed", fifo.name: "damaged", listed.name: "damaged"}, status
    for run in (fifo, listed):
        started = time.monotonic()
        window.run_actions.open(str(run.path))
        assert time.monotonic() - started < 10, "opened at once (a FIFO read would wait for ever)"
        qtbot.waitUntil(lambda run=run: window.run_model is not None and window.run_model.run.path == run.path,
                        timeout=10_000)
        assert not window.resume_action.isEnabled(), "a damaged run is read-only"
