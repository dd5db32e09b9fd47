"""Runtime faults injected for real: OOM, crashes, segfaults, a run directory in use, two runs at once."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, process_tree_gone, run_here, run_main, trusted_model, write_config

from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.model.checkpoint import load_weights_only

FAULTY_MODEL = """
import os, signal, time, torch
from torch import nn

class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(3, num_classes)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == {at}:
                {fault}
        return self.fc(x.mean((2, 3)))
"""


def faulty(tmp_path, shapes_dir, fault, at=3, **sections):
    name = trusted_model(tmp_path / "faulty.py", FAULTY_MODEL.format(at=at, fault=fault))
    return write_config(tmp_path, shapes_dir, model={"name": name}, **sections)


@pytest.mark.slow
def test_out_of_memory_fails_with_advice(shapes_dir, tmp_path):
    cfg = faulty(tmp_path, shapes_dir, "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20 GiB')")
    result = run_main("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 1
    message = RunDir(tmp_path / "run").read_status()["message"]
    assert message.startswith("out of memory") and "smaller data.batch_size" in message and "train.amp" in message
    assert "out of memory" in result.stderr


@pytest.mark.slow
def test_cpu_allocation_failure_is_reported_as_out_of_memory(shapes_dir, tmp_path):
    cfg = faulty(tmp_path, shapes_dir, "torch.empty(2**62, dtype=torch.uint8)")
    result = run_main("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 1
    assert RunDir(tmp_path / "run").read_status()["message"].startswith("out of memory")


@pytest.mark.slow
def test_exception_in_user_code_is_shown_and_the_run_resumes(shapes_dir, tmp_path):
    cfg = faulty(tmp_path, shapes_dir, "raise ValueError('bad idea in forward')", at=9, data={"batch_size": 16},
                 train={"epochs": 2})
    result = run_main("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 1
    run = RunDir(tmp_path / "run")
    assert run.read_status()["message"] == "ValueError: bad idea in forward"
    error = next(e for e in read_events(run.events) if e["event"] == "error")
    assert "faulty.py" in error["traceback"] and "bad idea in forward" in error["traceback"]
    assert load_weights_only(run.checkpoints / "last.pt")["epoch"] == 1, "the epoch-1 checkpoint survives"
    result = run_here("resume", run.path)  # the fault fired once: the resumed run trains on (in this process)
    assert result.returncode == 0, result.stderr[-2000:]
    assert run.read_status()["state"] == "completed"


@pytest.mark.slow
def test_segfault_leaves_a_resumable_run(shapes_dir, tmp_path):
    # The crash comes once the epoch-1 checkpoint is durable (it is written in the background; a crash inside that
    # write window is test_checkpoints.py::test_a_hard_crash_inside_the_write_window_loses_that_checkpoint_alone).
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    wait = f"[time.sleep(0.02) for _ in range(3000) if not os.path.exists({str(last)!r})]"
    cfg = faulty(tmp_path, shapes_dir, f"{wait}; os.kill(os.getpid(), signal.SIGSEGV)", at=9,
                 data={"batch_size": 16}, train={"epochs": 2}, checkpoint={"writer": "background"})
    result = run_main("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV)
    run = RunDir(tmp_path / "run")
    assert run.effective_state() == "failed"
    assert load_weights_only(run.checkpoints / "last.pt")["epoch"] == 1
    assert run_here("resume", run.path).returncode == 0  # in this process: the crash was the other one's
    epochs = [e["epoch"] for e in read_events(run.events) if e["event"] == "epoch"]
    assert epochs == [1, 2]


@pytest.mark.slow
def test_a_run_directory_in_use_is_refused(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 2}, train={"epochs": 50})
    first = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir",
                              str(tmp_path / "run")], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.time() + 60
        while RunDir(tmp_path / "run").first_event("run_start") is None and time.time() < deadline:
            time.sleep(0.1)  # started, its config.yaml final (what auto decided written before run_start)
        config_before = (tmp_path / "run" / "config.yaml").read_text()
        # refusals: asked from the test's own process (another process than the run's, as a second launch is)
        second = run_here("train", cfg, "--run-dir", tmp_path / "run", "--set", "train.epochs=1")
        assert second.returncode == 2 and f"in use by another run (pid {first.pid})" in second.stderr
        assert (tmp_path / "run" / "config.yaml").read_text() == config_before
        third = run_here("resume", tmp_path / "run")
        assert third.returncode == 2 and "still going" in third.stderr
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=30)
    assert RunDir(tmp_path / "run").read_status()["state"] == "stopped"
    assert process_tree_gone(first.pid)


@pytest.mark.slow
def test_two_ddp_runs_at_once_do_not_collide(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    procs = [subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--runs-dir",
                               str(tmp_path / "runs"), "--set", "device.parallel=ddp", "device.nproc=2"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-1500:] + outs[1][1][-1500:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(RunDir(r).read_status()["state"] == "completed" for r in runs)
