"""Jobs that survive a shared cluster (issue #73), against the real one-node SLURM of tests/servers/start_slurm.sh:
the script `main.py slurm` writes, submitted with sbatch. SLURM's warning signal (sent by SLURM itself before the
time limit, or by `scancel --signal`) checkpoints the run, which ends `preempted`; the job requeues itself and
completes in the same run directory with the weights of an uninterrupted run; `scontrol requeue` does the same
through a stop; the requeue limit ends a job that keeps being preempted."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
import torch
from helpers import run_here, write_config

from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.model.checkpoint import load_weights_only

pytestmark = pytest.mark.slow


def job_fields(job: str) -> dict:
    done = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
    return dict(f.split("=", 1) for f in done.stdout.split() if "=" in f) if done.returncode == 0 else {}


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen in {timeout} s")


def events_of(run_dir) -> list[dict]:
    return read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []


def submit(tmp_path, shapes_dir, *sets: str, epochs: int = 2) -> tuple[str, object, object]:
    """(job id, its run directory, the config): the script `main.py slurm` writes for a small run, sbatch'ed."""
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": epochs, "seed": 0},
                       monitor={"log_every": 1}, device={"share_cpu": False})
    runs = tmp_path / "runs"
    script = tmp_path / "job.sh"
    env = dict(os.environ, TRAINDECK_RUNS=str(runs))
    made = run_here("slurm", cfg, *(["--set", *sets] if sets else []), "--out", script, env=env)
    assert made.returncode == 0, made.stderr
    job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", str(script)],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    return job, runs / f"slurm-{job}", cfg


def ended(job: str) -> dict:
    fields = job_fields(job)
    return fields if fields.get("JobState") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED") else {}


def same_weights(a_dir, b_dir) -> None:
    a, b = (load_weights_only(d / "checkpoints" / "last.pt") for d in (a_dir, b_dir))
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_slurms_warning_checkpoints_the_run_and_the_job_requeues_itself_and_completes_it_exactly(slurm, shapes_dir,
                                                                                                  tmp_path):
    job, run_dir, cfg = submit(tmp_path, shapes_dir)
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 3 for e in events_of(run_dir)), 120, "step 3")
        subprocess.run(["scancel", "--signal=USR1", job], check=True)  # what SLURM sends before the time limit
        wait_for(lambda: RunDir(run_dir).read_status().get("state") == "preempted", 60, "the preempted state")
        fields = wait_for(lambda: ended(job), 300, "the job's end")
    finally:
        subprocess.run(["scancel", job])
    output = (tmp_path / "job.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields.get("Restarts") == "1", (fields, output[-2000:])
    assert "traindeck: preempted; requeueing job" in output
    status = RunDir(run_dir).read_status()
    assert status["state"] == "completed" and status["requeues"] == 1 and status["requeue_lost_s"] > 0, status
    events = events_of(run_dir)
    ends = [e["status"] for e in events if e["event"] == "run_end"]
    assert ends == ["preempted", "completed"], ends
    [restart] = [e for e in events if e["event"] == "restart"]
    assert restart["by"] == "slurm" and restart["count"] == 1 and restart["checkpoint"], restart
    straight = tmp_path / "straight"
    assert run_here("train", cfg, "--run-dir", straight).returncode == 0
    same_weights(straight, run_dir)


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
    job, run_dir, _ = submit(tmp_path, shapes_dir, "device.requeue_limit=1", epochs=8)
    try:
        for segment in (1, 2):
            wait_for(lambda n=segment: len([e for e in events_of(run_dir) if e["event"] == "run_start"]) == n
                     and events_of(run_dir)[-1]["event"] == "step", 180, f"segment {segment} training")
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
