"""SLURM through a login node (a real one-node cluster on this machine): pending with its reason, running, completed;
scancel mid-run stops it with a checkpoint; a request no node can meet is refused before it is submitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from helpers import run_here, write_config

from tests.remote.test_remote_runs import start_remote_train, wait_for_mirror

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not seen in {timeout} s")


def mirror_status(local_runs):
    for path in (local_runs / "remote" / "cluster").glob("*/status.json"):
        try:
            return path.parent, json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
    return None


def test_a_job_pends_with_its_reason_then_runs_and_its_results_come_home(slurm, hosts, shapes_dir, tmp_path):
    blocker = subprocess.run(["sbatch", "--parsable", f"--cpus-per-task={os.cpu_count()}", "--output=/dev/null",
                              "--wrap", "sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        wait_for(lambda: subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True,
                                        text=True).stdout.strip() == "RUNNING", 30, "the blocking job running")
        proc = start_remote_train(write_config(tmp_path, shapes_dir), hosts["local_runs"], host="cluster")
        mirror, status = wait_for(lambda: (s := mirror_status(hosts["local_runs"])) and "pending (" in
                                  s[1].get("message", "") and s, 60, "the pending state")
        assert status["message"].endswith("pending (Resources)") and status["state"] == "starting"
    finally:
        subprocess.run(["scancel", blocker])
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "submitted SLURM job" in out and "run completed" in out
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "completed" and status["remote"]["job"]["active"] is False
    remote = hosts["remote_runs"] / f"slurm-{status['remote']['job']['job']}"
    assert (mirror / "events.jsonl").read_bytes() == (remote / "events.jsonl").read_bytes()
    assert (mirror / "eval" / "val" / "metrics.json").exists()


def test_scancel_mid_run_stops_it_with_a_checkpoint_and_it_resumes(slurm, hosts, shapes_dir, tmp_path):
    proc = start_remote_train(write_config(tmp_path, shapes_dir, train={"epochs": 40, "seed": 0}),
                              hosts["local_runs"], host="cluster")
    mirror = wait_for_mirror(hosts["local_runs"], "cluster", "epoch", proc, timeout=180)
    proc.send_signal(signal.SIGTERM)  # the app's Stop: scancel there
    out, err = proc.communicate(timeout=120)
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "stopped", (status, err)
    remote = hosts["remote_runs"] / f"slurm-{json.loads((mirror / 'remote.json').read_text())['job']}"
    assert (remote / "checkpoints" / "last.pt").exists()
    done = run_here("resume", remote, "--epochs", str(status["epoch"] + 1))  # on the cluster's disk
    assert done.returncode == 0, done.stderr
    assert json.loads((remote / "status.json").read_text())["state"] == "completed"


def test_a_request_no_node_can_meet_is_refused_before_submitting(slurm, hosts, shapes_dir, tmp_path):
    too_many = os.cpu_count() + 1
    config = write_config(tmp_path, shapes_dir, data={"num_workers": too_many - 1})
    done = run_here("train", config, "--host", "cluster", "--runs-dir", hosts["local_runs"])
    assert done.returncode == 2
    assert (f"cluster: --cpus-per-task {too_many}: no node of partition debug has more than {os.cpu_count()} CPUs"
            in done.stderr)
    assert not (hosts["local_runs"] / "remote").exists()
    queue = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    assert "traindeck" not in queue
