"""The standby trainer (`main.py standby`): imports first, then runs the one command it is handed, as main.py would."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, write_config

from trainer.core.events import read_events
from trainer.core.rundir import RunDir


def standby() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "main.py"), "standby"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_standby_runs_the_train_command_it_is_handed(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    run = RunDir(tmp_path / "run").create()
    proc = standby()
    out, err = proc.communicate(json.dumps({"argv": ["train", str(cfg), "--run-dir", str(run.path)],
                                            "output": str(run.output_log)}) + "\n", timeout=300)
    assert proc.returncode == 0, run.output_log.read_text()[-2000:]
    assert run.read_status()["state"] == "completed"
    assert run.read_status()["worker_pid"] == proc.pid, "trained in the standby process itself"
    assert [e["epoch"] for e in read_events(run.events) if e["event"] == "epoch"] == [1]
    assert "epoch 1/1" in run.output_log.read_text(), "its console output went to the run's output.log"
    assert out == "" and err == ""


@pytest.mark.slow
def test_a_standby_refuses_other_commands_and_leaves_quietly_without_one(tmp_path):
    proc = standby()
    out, err = proc.communicate(json.dumps({"argv": ["export", "x"], "output": str(tmp_path / "o.log")}) + "\n",
                                timeout=120)
    assert proc.returncode == 2 and "runs train or resume, not ['export']" in err
    assert not (tmp_path / "o.log").exists()
    proc = standby()
    proc.communicate("", timeout=120)  # the app quit before a run: end of input
    assert proc.returncode == 0


def test_a_standby_told_to_go_in_the_middle_of_its_imports_leaves_at_once(tmp_path):
    """Closing the app let an unused standby finish importing torch first (~20 s on 2 cores). Here torch's import
    never ends (a stand-in found first on the path), so a standby that leaves with exit 0 left in the middle of it."""
    import os

    stand_in = tmp_path / "torch"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("import sys, time\nprint('importing torch', file=sys.stderr, flush=True)\n"
                                          "time.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "standby"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr.readline().strip() == "importing torch"
        proc.terminate()
        assert proc.wait(timeout=60) == 0, "it left when told, in the middle of its imports"  # 60 s: a hang guard
    finally:
        proc.kill()
