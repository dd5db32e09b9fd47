"""Where the window's runs go (issue #71): not the folder the app was started from, but TrainDeck's data folder until
the user chooses one on the Runs page, which is remembered; --runs-dir wins."""

import shlex

from helpers import write_config
from PySide6.QtGui import QGuiApplication
from test_main_window import wait_ready

from app.main import parse_args
from app.state.runs_folder import SETTING, RunsFolder


def test_runs_go_to_the_data_folder_then_to_the_one_chosen_which_the_next_start_remembers(
        qtbot, make_window, settings, shapes_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINDECK_RUNS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    started_in = tmp_path / "checkout"  # the folder a user starts `python main.py` from
    started_in.mkdir()
    monkeypatch.chdir(started_in)
    config = write_config(tmp_path, shapes_dir)

    first = RunsFolder.at_start(parse_args([]).runs_dir, settings.value(SETTING))
    assert first.path == tmp_path / "data" / "traindeck" / "runs"
    window = make_window(config, runs_dir=first.path)
    assert window.runs_page.folder.text() == str(first.path)

    chosen = tmp_path / "my runs"
    window.runs_page.runsDirChosen.emit(str(chosen))  # what Change… sends once a folder is picked
    assert chosen.is_dir() and window.runs_page.folder.text() == str(chosen)
    wait_ready(qtbot, window)
    window.binder.widgets["optimizer.lr"].setText("0.0123")  # a form that differs from its file
    qtbot.waitUntil(window.start_action.isEnabled, timeout=5_000)
    window.copy_action.trigger()  # Command: writes the form's config where runs go
    command = shlex.split(QGuiApplication.clipboard().text())
    assert command[3].startswith(str(chosen / "configs")) and command[command.index("--runs-dir") + 1] == str(chosen)
    assert list(started_in.iterdir()) == [], "nothing is written where the app was started"

    assert RunsFolder.at_start(None, settings.value(SETTING)).path == chosen, "the next start opens there"
    given = tmp_path / "given"
    assert RunsFolder.at_start(parse_args(["--runs-dir", str(given)]).runs_dir,
                               settings.value(SETTING)).path == given, "--runs-dir wins"
    chosen.rename(tmp_path / "moved away")
    assert RunsFolder.at_start(None, settings.value(SETTING)).path == first.path, "a folder gone: the default again"


def test_a_run_made_elsewhere_is_in_the_table_by_the_apps_own_watch(qtbot, make_window, tmp_path, monkeypatch):
    """Issue #71: a run started from the window appeared in the Runs table only after Refresh. The page is not shown
    here and its follow timer is off: only the watch of the runs folder can bring the run in."""
    from app.pages import runs_page
    from trainer.core.config import RunConfig, save_config
    from trainer.core.rundir import RunDir

    monkeypatch.setattr(runs_page, "FOLLOW_MS", 10**8)
    window = make_window(runs_dir=tmp_path / "runs")
    page = window.runs_page
    assert not page.isVisible()
    assert not (tmp_path / "runs").exists(), "nothing is made before a run is"
    qtbot.waitUntil(lambda: str(tmp_path) in page._watch.directories(), timeout=5_000)  # where it will appear
    # as the trainer makes a run: the folder (the runs folder with it), then its config (listed from then on)
    run = RunDir(tmp_path / "runs" / "from-the-command-line").create()
    qtbot.waitUntil(lambda: str(run.path) in page._watch.directories(), timeout=5_000)  # not a run yet: watched
    save_config(RunConfig(), run.config)
    qtbot.waitUntil(lambda: [r["run"] for r in page.rows] == [run.name], timeout=5_000)
    assert str(run.path) not in page._watch.directories(), "a run: its own folder is no longer watched"
