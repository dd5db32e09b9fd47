"""Real processes: SIGTERM/SIGKILL during a run, resume, and the CLI commands around runs."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from helpers import REPO, process_tree_gone, run_here, run_main, train_here, wait_for_event, write_config

from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.device.precision import choose_precision
from trainer.model.checkpoint import load_weights_only
from trainer.train.loop import Loop


def start_train(cfg_path, run_dir, *extra):
    return subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg_path), "--run-dir", str(run_dir),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=REPO)


def slow_config(tmp_path, shapes_dir, **sections):
    # Many small steps so that a signal lands mid-epoch.
    sections.setdefault("data", {}).update({"batch_size": 4})
    sections.setdefault("train", {}).setdefault("epochs", 4)
    return write_config(tmp_path, shapes_dir, monitor={"log_every": 1}, **sections)


@pytest.mark.slow
def test_sigterm_stops_with_a_loadable_checkpoint(shapes_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(slow_config(tmp_path, shapes_dir), run_dir)
    wait_for_event(run_dir, lambda e: e["event"] == "step" and e["step"] >= 3)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)  # a hang guard: the checks below say it stopped at the next step
    assert proc.returncode == 0, err
    status = RunDir(run_dir).read_status()
    assert status["state"] == "stopped"
    state = load_weights_only(run_dir / "checkpoints" / "last.pt")
    assert state["step"] >= 3
    events = read_events(run_dir / "events.jsonl")
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "stopped"
    assert any(e["event"] == "checkpoint" and e["mid_epoch"] for e in events)
    assert process_tree_gone(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_resume_ends_with_the_same_weights_as_an_uninterrupted_run(shapes_dir, tmp_path, how):
    # device.share_cpu off: torch's thread count, fitted to a busy machine's load, changes the float sums
    cfg = slow_config(tmp_path, shapes_dir, train={"epochs": 3}, checkpoint={"every_steps": 5},
                      data={"augment": {"color_jitter": 0.2}}, device={"share_cpu": False})
    straight = tmp_path / "straight"
    assert run_here("train", cfg, "--run-dir", straight).returncode == 0

    interrupted = tmp_path / "interrupted"  # checkpoints written in the background: a kill may land mid-write
    proc = start_train(cfg, interrupted, "--set", "checkpoint.writer=background")
    wait_for_event(interrupted, lambda e: e["event"] == "checkpoint" and e["step"] >= 10 and e["mid_epoch"])
    os.killpg(proc.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    proc.communicate(timeout=30)
    if how == "sigkill":
        assert RunDir(interrupted).effective_state() == "failed"
    result = run_here("resume", interrupted)
    assert result.returncode == 0, result.stderr
    a = load_weights_only(straight / "checkpoints" / "last.pt")
    b = load_weights_only(interrupted / "checkpoints" / "last.pt")
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    events = read_events(interrupted / "events.jsonl")
    epochs = [e["epoch"] for e in events if e["event"] == "epoch"]
    assert epochs[-1] == 3 and sorted(set(epochs)) == [1, 2, 3], "curves continue in the same events file"
    # the epoch cut by the kill is the whole epoch's loss, the part trained before it included
    assert epoch_losses(interrupted) == pytest.approx(epoch_losses(straight), rel=1e-5)
    assert [e["checkpoint_writer"] for e in events if e["event"] == "run_start"] == ["background", "background"]


@pytest.mark.slow
def test_slurms_warning_signal_ends_a_run_preempted_and_the_job_started_again_goes_on_in_it(shapes_dir, tmp_path):
    """SIGUSR1 (sbatch --signal) to every process of the job step: the run checkpoints, ends `preempted`, exit 4 (the
    script requeues on it); `train --resumable` in the same directory, as the requeued job runs it, goes on from
    there to the weights of an uninterrupted run and records the requeue; once completed, a start again does nothing."""
    cfg = slow_config(tmp_path, shapes_dir, train={"epochs": 2}, device={"share_cpu": False})
    straight = tmp_path / "straight"
    assert run_here("train", cfg, "--run-dir", straight).returncode == 0

    run_dir = tmp_path / "slurm-77"
    proc = start_train(cfg, run_dir, "--resumable")
    wait_for_event(run_dir, lambda e: e["event"] == "step" and e["step"] >= 3, proc=proc)
    os.killpg(proc.pid, signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err[-2000:]
    status = RunDir(run_dir).read_status()
    assert status["state"] == "preempted" and "preempted at epoch 1" in status["message"], status
    ended = read_events(run_dir / "events.jsonl")[-1]
    assert ended["event"] == "run_end" and ended["status"] == "preempted"
    assert load_weights_only(run_dir / "checkpoints" / "last.pt")["step"] == ended["step"] >= 3

    requeued = dict(os.environ, SLURM_RESTART_COUNT="1")
    again = subprocess.run([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(run_dir),
                            "--resumable"], cwd=REPO, env=requeued, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "preempted: going on from its last checkpoint" in again.stdout
    status = RunDir(run_dir).read_status()
    assert status["state"] == "completed" and status["requeues"] == 1 and status["requeue_lost_s"] >= 0
    events = read_events(run_dir / "events.jsonl")
    [restart] = [e for e in events if e["event"] == "restart"]
    assert restart["by"] == "slurm" and restart["count"] == 1 and restart["step"] == ended["step"]
    a, b = (load_weights_only(d / "checkpoints" / "last.pt") for d in (straight, run_dir))
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)

    once_more = run_here("train", cfg, "--run-dir", run_dir, "--resumable")
    assert once_more.returncode == 0 and "completed: nothing more to do" in once_more.stdout
    assert len(read_events(run_dir / "events.jsonl")) == len(events)


def epoch_losses(run_dir) -> dict[int, float]:
    """Each epoch's train loss as the run's last epoch event for it says (a resumed run may log one again)."""
    return {e["epoch"]: e["train_loss"] for e in read_events(run_dir / "events.jsonl") if e["event"] == "epoch"}


def test_a_stop_on_an_epochs_last_step_then_resume_logs_that_epochs_real_loss(shapes_dir, tmp_path, monkeypatch):
    # issue #71: stopped with ckpt-e0002-s00000075 (step 75 ends epoch 3), Resume logged epoch 3 with train_loss 0.0
    cfg = slow_config(tmp_path, shapes_dir, train={"epochs": 2}, device={"share_cpu": False})
    straight, code = train_here(cfg, tmp_path / "straight")
    assert code == 0
    log_step = Loop.log_step

    def stop_on_the_first_epochs_last_step(self, window, result, batches, *rest):
        if self.state.epoch == 0 and self.state.batch_in_epoch == batches:
            self.stop.requested = True  # as the Stop button's file or a SIGTERM would, read at this log step
        return log_step(self, window, result, batches, *rest)

    monkeypatch.setattr(Loop, "log_step", stop_on_the_first_epochs_last_step)
    run, code = train_here(cfg, tmp_path / "stopped")
    monkeypatch.setattr(Loop, "log_step", log_step)
    assert run.read_status()["state"] == "stopped"
    saved = [e for e in read_events(run.events) if e["event"] == "checkpoint"]
    assert saved[-1]["mid_epoch"] and saved[-1]["epoch"] == 0, "stopped after the epoch's last step, before its end"
    assert not [e for e in read_events(run.events) if e["event"] == "epoch"]

    run, code = train_here(cfg, None, run=run, resume=True)
    assert code == 0
    losses = epoch_losses(run.path)
    assert sorted(losses) == [1, 2] and all(loss > 0 for loss in losses.values())
    assert losses == pytest.approx(epoch_losses(straight.path), rel=1e-5)


def test_resume_refuses_a_completed_run_and_a_missing_dir(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    assert run_here("train", cfg, "--run-dir", tmp_path / "r").returncode == 0
    result = run_here("resume", tmp_path / "r")
    assert result.returncode == 2 and "already completed" in result.stderr
    result = run_here("resume", tmp_path / "nowhere")
    assert result.returncode == 2 and "not a run directory" in result.stderr


def test_train_cli_reports_progress_and_result(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 2})
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert "epoch 1/2" in result.stdout and "epoch 2/2" in result.stdout
    assert "run completed, best val_acc" in result.stdout
    run_dir = next((tmp_path / "runs").iterdir())
    assert {"config.yaml", "events.jsonl", "status.json", "train.log", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()}
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def test_missing_train_dir_fails_with_its_path(tmp_path):
    cfg = write_config(tmp_path, tmp_path / "nope")
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2
    assert f"data.train_dir: {tmp_path / 'nope'}: folder does not exist" in result.stderr


def test_check_data_reports_classes_and_bad_files(shapes_dir, tmp_path):
    result = run_here("check-data", shapes_dir)
    assert result.returncode == 0
    assert "4 classes, 120 usable images" in result.stdout and "circle" in result.stdout
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.png").write_bytes(b"not an image")
    result = run_here("check-data", flat)
    assert result.returncode == 1 and "no class sub-folders" in result.stdout


@pytest.mark.slow
def test_demo_config_reaches_90_percent(tmp_path):
    """The README's first run: the built-in demo data and config."""
    from trainer.data.demo_data import write_demo_dataset

    write_demo_dataset(tmp_path / "demo_data")
    (tmp_path / "cfg").mkdir()
    cfg = tmp_path / "cfg" / "demo.yaml"
    cfg.write_text((REPO / "resources" / "demo.yaml").read_text())
    result = run_main("train", cfg, "--runs-dir", tmp_path / "runs", timeout=300)
    assert result.returncode == 0, result.stderr
    run = next((tmp_path / "runs").iterdir())
    status = json.loads(run.joinpath("status.json").read_text())
    assert status["best_acc"] >= 0.9
    start = next(e for e in read_events(run / "events.jsonl") if e["event"] == "run_start")
    # The defaults: the precision this CPU runs natively, channels_last for the built-in conv net where it is faster.
    assert start["precision"] == choose_precision("auto", torch.device("cpu"))[0]
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert start["memory_format"] == ("channels_last" if avx512 else "contiguous_format") and start["cache"] == "memory"
