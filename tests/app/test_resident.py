"""The resident worker (issue #51): the app's quick questions go to one long-lived torch process, which answers as the
command line does; killed mid-question, it is started again and the question asked again."""

import json
import os
import signal

import pytest
from helpers import run_here
from PySide6.QtCore import QObject

from app.jobs.background import CliJob, ResidentWorker
from trainer.runs.commands import DescribeModel, LrFind, Predict


def ask(qtbot, request):
    """A question through the app's client; (its answer, the worker's pid when it answered)."""
    owner = QObject()  # the asking widget (kept while the answer comes)
    got = {}
    job = CliJob(request, owner)
    job.done.connect(lambda answer: got.setdefault("answer", answer))
    job.failed.connect(lambda error: got.setdefault("error", error))
    qtbot.waitUntil(lambda: bool(got), timeout=120_000)
    return got, ResidentWorker.shared().pid


def test_questions_share_one_worker_and_get_the_command_line_s_answer(qtbot, shapes_dir, tmp_path):
    first, pid = ask(qtbot, DescribeModel(name="resnet18"))
    again, same = ask(qtbot, DescribeModel(name="small_cnn"))
    assert pid is not None and same == pid, "one worker answers both"
    assert first["answer"] == json.loads(run_here("describe-model", "resnet18").stdout), "the CLI's own answer"
    assert again["answer"]["name"] == "small_cnn"
    refused, _ = ask(qtbot, Predict(model=str(tmp_path / "nowhere"), images=[str(next(shapes_dir.rglob("*.png")))],
                                    json=True))
    assert refused == {"error": f"{tmp_path / 'nowhere'}: no such model file or run directory"}, "its one line"


@pytest.mark.slow
def test_a_killed_worker_is_started_again_and_the_question_asked_again(qtbot):
    _, pid = ask(qtbot, DescribeModel(name="small_cnn"))
    owner = QObject()
    got = {}
    job = CliJob(DescribeModel(name="resnet18"), owner)
    job.done.connect(lambda answer: got.setdefault("answer", answer))
    job.failed.connect(lambda error: got.setdefault("error", error))
    os.kill(pid, signal.SIGKILL)  # killed with the question in flight
    qtbot.waitUntil(lambda: bool(got), timeout=120_000)
    assert got["answer"]["name"] == "resnet18" and ResidentWorker.shared().pid not in (None, pid)


def test_a_worker_that_cannot_start_fails_its_questions_saying_so(qtbot, monkeypatch):
    import app.jobs.background as background

    worker = ResidentWorker()
    monkeypatch.setattr(ResidentWorker, "shared", classmethod(lambda cls: worker))
    monkeypatch.setattr(background, "main_command", lambda *args: ["/nonexistent/python", *args])
    got, _ = ask(qtbot, DescribeModel(name="small_cnn"))
    assert got == {"error": "could not start python for the resident worker"}


@pytest.mark.slow
def test_a_long_question_streams_its_progress_and_giving_it_up_frees_the_worker(qtbot, shapes_dir, tmp_path):
    """The learning-rate finder in the worker: its points come as it measures them (the app draws them), and a sweep
    given up (its window closed) does not keep the worker from the next question."""
    from helpers import write_config

    config = write_config(tmp_path, shapes_dir)
    owner = QObject()
    points, got = [], {}
    job = CliJob(LrFind(config=str(config), json=True, steps=5000, end=1e-3), owner)  # minutes if left
    job.progress.connect(lambda line: line.startswith("lr-find: point") and points.append(line))
    job.done.connect(lambda answer: got.setdefault("answer", answer))
    qtbot.waitUntil(lambda: len(points) >= 3, timeout=120_000)
    pid = ResidentWorker.shared().pid
    assert not got, "the points come before the answer"
    job.cancel()  # mid-sweep
    answer, new_pid = ask(qtbot, DescribeModel(name="small_cnn"))
    assert answer["answer"]["name"] == "small_cnn" and new_pid != pid, "a fresh worker answers at once"
    assert not got, "the sweep given up says nothing more"
