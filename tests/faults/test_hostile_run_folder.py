"""A run folder is user input (issue #67): a colleague's, a host's, a copy, a crash. Its own files are read through
one opener (a regular file of the run's own, bounded, shape-checked); a run whose files fail that is damaged, says
why in one line, and never stops a listing, the queue or another run."""

import json
import os
import shutil
import time

import pytest
from helpers import run_here, run_main, train_here, write_config

from trainer.core.events import EventTail, read_events
from trainer.core.rundir import RunDir
from trainer.core.summary import MAX_EVENT_LINE


@pytest.fixture(scope="module")
def finished(tmp_path_factory, shapes_dir):
    tmp = tmp_path_factory.mktemp("hostile-run")
    run, code = train_here(write_config(tmp, shapes_dir, train={"epochs": 1}), tmp / "runs")
    assert code == 0
    return run.path


def damage(run: RunDir, how: str, other: RunDir) -> None:
    status = run.status_file
    status.unlink()
    if how == "zero":
        status.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(status)
    elif how == "list":
        status.write_text("[1, 2, 3]")
    elif how == "other run's":
        status.symlink_to(other.status_file)
    elif how == "wrong kind":
        status.write_text(json.dumps({"state": "stopped", "epoch": "many"}))


HOW = ("zero", "fifo", "list", "other run's", "wrong kind")


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_status_is_one_line_and_stops_no_listing(finished, tmp_path, how):
    runs = tmp_path / "runs"
    good = RunDir(shutil.copytree(finished, runs / "good"))
    bad = RunDir(shutil.copytree(finished, runs / "bad"))
    damage(bad, how, good)
    started = time.monotonic()
    status = bad.read_status()
    assert status["state"] == "damaged" and "status.json" in status["damaged"], status
    resumed = run_here("resume", bad.path, "--force")
    assert resumed.returncode == 2 and "the run is damaged and is not resumed" in resumed.stderr, resumed.stderr
    assert "Traceback" not in resumed.stderr and len(resumed.stderr.strip().splitlines()) == 1
    listed = run_here("queue", "list", "--runs-dir", runs)
    assert listed.returncode == 0 and f"damaged (passed over): {bad.path}" in listed.stderr
    assert time.monotonic() - started < 10, "each answered at once"
    assert good.read_status()["state"] == "completed" and good.read_status()["epoch"] == 1, "the other run untouched"


@pytest.mark.slow
def test_the_scheduler_passes_over_a_damaged_run_and_starts_the_next(finished, shapes_dir, tmp_path):
    runs = tmp_path / "runs"
    bad = RunDir(shutil.copytree(finished, runs / "bad"))
    os.unlink(bad.status_file)
    os.mkfifo(bad.status_file)  # a FIFO: reading it would wait for ever
    added = run_here("queue", "add", write_config(tmp_path, shapes_dir, train={"epochs": 1}), "--runs-dir", runs)
    assert added.returncode == 0, added.stderr
    queued = RunDir(added.stdout.strip().splitlines()[-1])
    result = run_main("queue", "run", "--runs-dir", runs, "--until-empty", timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert queued.read_status()["state"] == "completed" and bad.read_status()["state"] == "damaged"


def test_an_event_line_too_long_is_skipped_never_held_and_the_events_after_it_are_read(finished, tmp_path):
    run = RunDir(shutil.copytree(finished, tmp_path / "run"))
    run.summary.unlink(missing_ok=True)
    events = read_events(run.events)
    with open(run.events, "r+b") as f:  # a line past the longest an event may be (sparse: no disk), then ten events
        f.seek(MAX_EVENT_LINE + (16 << 20), os.SEEK_END)
        f.write(b"\n" + b"".join(json.dumps({**events[-1], "note": i}).encode() + b"\n" for i in range(10)))
        f.write(b'[1, 2]\n"a string"\n{"no": "event"}\n')  # JSON, but not events
    tail = EventTail(run.events)
    read = []
    while not tail.at_end:
        read += tail.read_new()
    assert [e.get("note") for e in read[-10:]] == list(range(10)) and tail.skipped == 4
    assert run.last_events("run_end")["run_end"]["note"] == 9, "through the summary's reader too"
    resumed = run_here("resume", run.path, "--epochs", "2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run.summary.stat().st_size < 1 << 20, "the long line was not copied into the summary"
    assert [e["event"] for e in read_events(run.events, summary=True)][-1] == "run_end"


def test_a_fifo_or_a_link_as_the_events_file_is_named_not_waited_on(finished, tmp_path):
    run = RunDir(shutil.copytree(finished, tmp_path / "run"))
    run.events.unlink()
    run.summary.unlink(missing_ok=True)
    os.mkfifo(run.events)
    tail = EventTail(run.events)
    assert tail.read_new() == [] and tail.at_end and "is a FIFO" in tail.problem
    resumed = run_here("resume", run.path, "--force")
    assert resumed.returncode == 2 and "events.jsonl: is a FIFO" in resumed.stderr, resumed.stderr
    run.events.unlink()
    run.events.symlink_to(finished / "events.jsonl")
    resumed = run_here("resume", run.path, "--force")
    assert resumed.returncode == 2 and "is a link" in resumed.stderr, resumed.stderr
    assert (finished / "events.jsonl").stat().st_size == os.path.getsize(finished / "events.jsonl")


def test_what_the_window_reads_of_a_run_is_never_waited_on(finished, tmp_path):
    """The app's log tail, the Runs table's test accuracy and the Results tab's evaluations read a run's files in the
    window's thread: a FIFO there would freeze it, a link would show another file."""
    from app.jobs.run_model import LogTail
    from app.state.eval_results import evaluation_label, read_evaluation
    from app.state.experiments import test_accuracy

    run = RunDir(shutil.copytree(finished, tmp_path / "run"))
    run.log.unlink()
    os.mkfifo(run.log)
    (run.evaluation("test")).mkdir(parents=True, exist_ok=True)
    os.mkfifo(run.evaluation("test") / "metrics.json")
    (run.evaluation("val") / "metrics.json").unlink()
    (run.evaluation("val") / "metrics.json").symlink_to("/dev/zero")
    started = time.monotonic()
    assert LogTail(run.log).read_new() == ""
    assert test_accuracy(run) is None and evaluation_label(run.path, "test") == "test"
    with pytest.raises(OSError, match="is a link"):
        read_evaluation(run.path, "val")
    assert time.monotonic() - started < 10
