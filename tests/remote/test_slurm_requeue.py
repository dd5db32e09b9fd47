"""Jobs that survive a shared cluster (issue #73), against the real one-node SLURM of tests/servers/start_slurm.sh:
the script `main.py slurm` writes, submitted with sbatch. SLURM's warning signal (sent by SLURM itself before the
time limit, or by `scancel --signal`) checkpoints the run, which ends `preempted`; the job requeues itself and
completes in the same run directory with the weights of an uninterrupted run; `scontrol requeue` does the same
through a stop; the requeue limit ends a job that keeps being preempted. SLURM holds a requeued job two minutes
before it may start again; the tests let it go at once (`ended`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO, run_here, write_config

from tests.remote.test_slurm_runs import wait_for
from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.model.checkpoint import load_weights_only

pytestmark = pytest.mark.slow


def job_fields(job: str) -> dict:
    done = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
    return dict(f.split("=", 1) for f in done.stdout.split() if "=" in f) if done.returncode == 0 else {}


def events_of(run_dir) -> list[dict]:
    return read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []


def submit(tmp_path, shapes_dir, *sets: str, epochs: int = 30, budget: float = 0,
           env: dict | None = None) -> tuple[str, object, object]:
    """(job id, its run directory, the config): the script `main.py slurm` writes for a small run (many small steps,
    about 10 s of training: a signal lands in it), sbatch'ed."""
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": epochs, "seed": 0,
                                                                            "budget": budget},
                       monitor={"log_every": 1}, device={"share_cpu": False})
    runs = tmp_path / "runs"
    script = tmp_path / "job.sh"
    made = run_here("slurm", cfg, *(["--set", *sets] if sets else []), "--out", script,
                    env=dict(os.environ, TRAINDECK_RUNS=str(runs)))
    assert made.returncode == 0, made.stderr
    job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", str(script)], env=env,
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    return job, runs / f"slurm-{job}", cfg


def training_in_segment(run_dir, n: int) -> bool:
    """The run's `n`th launch has trained a step (its first events are run_start's, the last may be grad_stats)."""
    kinds = [e["event"] for e in events_of(run_dir)]
    starts = [i for i, kind in enumerate(kinds) if kind == "run_start"]
    return len(starts) == n and "step" in kinds[starts[-1]:]


HOLD_KEPT_S = 5  # of SLURM's hold of a requeued job: its node's clean-up of the last start (a start before it ends
# is refused: "Killing non-startable batch job: Job credential revoked")
_held_since: dict[str, float] = {}


def ended(job: str) -> dict:
    """The job's fields once it has ended, else {}. A requeued job that SLURM holds (its begin time two minutes on,
    by design) is let go after HOLD_KEPT_S, as an administrator may: the tests wait for TrainDeck, not for that."""
    fields = job_fields(job)
    if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
        since = _held_since.setdefault(f"{job}/{fields.get('Restarts')}", time.time())
        if time.time() - since > HOLD_KEPT_S:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
    return fields if fields.get("JobState") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED") else {}


def same_weights(a_dir, b_dir) -> None:
    a, b = (load_weights_only(d / "checkpoints" / "last.pt") for d in (a_dir, b_dir))
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_a_job_at_its_time_limit_is_warned_checkpoints_requeues_itself_and_goes_on_exactly(slurm, shapes_dir,
                                                                                           tmp_path):
    """`device.slurm_time_min: 1` (sbatch --time=1) and the script's warning: SLURM itself warns the run before the
    limit, it ends preempted with a checkpoint, the job requeues itself (as often as the limit comes) and the run
    completes in the same run directory (its `train.budget` spent: a time, so the test takes the same time on any
    machine), on the very path of an uninterrupted run of the same seed beside it: every step's loss and every
    epoch's validation the same. The run beside it has no budget: it is stopped once its steps pass the job's last
    (a budget of its own would reach fewer steps than the job's on a loaded machine)."""
    one_thread = dict(os.environ, OMP_NUM_THREADS="1")  # the job (sbatch passes it on) and the run beside it: the
    # same arithmetic, and neither waits on the other's threads for a core
    job, run_dir, cfg = submit(tmp_path, shapes_dir, "device.slurm_time_min=1", "device.requeue_limit=5", epochs=400,
                               budget=0.8, env=one_thread)
    straight = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir",
                                 str(tmp_path / "straight"), "--set", "train.budget=0"],  # stopped past the job's end
                                cwd=REPO, env=one_thread, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        fields = wait_for(lambda: ended(job), 600, "the job's end")
        last_step = max(e["step"] for e in events_of(run_dir) if e["event"] == "step")
        wait_for(lambda: straight.poll() is not None or any(e["event"] == "step" and e["step"] > last_step
                                                            for e in events_of(tmp_path / "straight")),
                 600, f"the run beside it past step {last_step}")
        straight.terminate()  # Stop: it ends "stopped" at its next step
        _, err = straight.communicate(timeout=120)
    finally:
        subprocess.run(["scancel", job])
        if straight.poll() is None:
            straight.kill()
    output = (tmp_path / "job.out").read_text()
    straight_ends = [e["status"] for e in events_of(tmp_path / "straight") if e["event"] == "run_end"]
    assert straight_ends == ["stopped"], (straight.returncode, err[-2000:])
    assert fields["JobState"] == "COMPLETED" and int(fields.get("Restarts", 0)) >= 1, (fields, output[-2000:])
    assert "#SBATCH --time=1\n" in (tmp_path / "job.sh").read_text()
    status = RunDir(run_dir).read_status()
    requeues = int(fields["Restarts"])
    assert status["state"] == "completed" and status["requeues"] == requeues and status["requeue_lost_s"] > 0
    events = events_of(run_dir)
    ends = [e for e in events if e["event"] == "run_end"]
    assert [e["status"] for e in ends] == ["preempted"] * requeues + ["completed"], ends
    restarts = [e for e in events if e["event"] == "restart"]
    assert [(e["by"], e["count"]) for e in restarts] == [("slurm", n) for n in range(1, requeues + 1)]
    assert all(e["checkpoint"] for e in restarts), restarts
    reference = events_of(tmp_path / "straight")
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "step"}
    expected = {e["step"]: e["loss"] for e in reference if e["event"] == "step"}
    common = sorted(losses.keys() & expected.keys())
    assert common and common[-1] > restarts[-1]["step"], "both ran past the last restart"
    assert [losses[s] for s in common] == pytest.approx([expected[s] for s in common], rel=1e-5)
    # an epoch by its number and its last step: the job's last may be cut short by its budget (a loaded machine),
    # validated on fewer steps than the same epoch beside it
    validated = {(e["epoch"], e["step"]): (e["val_loss"], e["val_acc"]) for e in events if e["event"] == "epoch"}
    reference_epochs = {(e["epoch"], e["step"]): (e["val_loss"], e["val_acc"]) for e in reference
                        if e["event"] == "epoch"}
    both = sorted(validated.keys() & reference_epochs.keys())
    assert len(both) >= 3
    assert [v for k in both for v in validated[k]] == pytest.approx([v for k in both for v in reference_epochs[k]],
                                                                    rel=1e-5)


def test_scontrol_requeue_stops_the_run_and_the_job_goes_on_with_it_in_the_same_directory(slurm, shapes_dir,
                                                                                        tmp_path):
    job, run_dir, _ = submit(tmp_path, shapes_dir)
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 3 for e in events_of(run_dir)), 120, "step 3")
        subprocess.run(["scontrol", "requeue", job], check=True)
        fields = wait_for(lambda: ended(job), 300, "the job's end")
    finally:
        subprocess.run(["scancel", job])
    assert fields["JobState"] == "COMPLETED" and fields.get("Restarts") == "1", fields
    events = events_of(run_dir)
    assert [e["status"] for e in events if e["event"] == "run_end"] == ["stopped", "completed"]
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[1]["resumed_from"] and starts[1]["start_step"] >= 3
    assert RunDir(run_dir).read_status()["requeues"] == 1


def test_the_requeue_limit_ends_a_job_that_keeps_being_preempted(slurm, shapes_dir, tmp_path):
    job, run_dir, _ = submit(tmp_path, shapes_dir, "device.requeue_limit=1", epochs=60)
    try:
        for segment in (1, 2):
            wait_for(lambda n=segment: not ended(job) and training_in_segment(run_dir, n), 180,
                     f"segment {segment} training")
            subprocess.run(["scancel", "--signal=USR1", job], check=True)
            wait_for(lambda n=segment: [e["status"] for e in events_of(run_dir)
                                        if e["event"] == "run_end"].count("preempted") == n, 60, f"preempted {segment} times")
        fields = wait_for(lambda: ended(job), 120, "the job's end")
    finally:
        subprocess.run(["scancel", job])
    output = (tmp_path / "job.out").read_text()
    assert fields["JobState"] == "FAILED" and fields.get("Restarts") == "1", (fields, output[-2000:])
    assert re.search(r"requeued 1 times already \(device.requeue_limit\): not again", output), output[-2000:]
    status = RunDir(run_dir).read_status()
    assert status["state"] == "preempted" and status["requeues"] == 1
