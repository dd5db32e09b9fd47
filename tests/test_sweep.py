"""Sweeps: a grid gives every combination, a random sweep is reproducible from its seed, bad sweep files are refused
before anything is queued, and Optuna's pruner stops weak trials."""

import pytest
import yaml
from helpers import run_here, run_main, write_config

from trainer.core.rundir import RunDir
from trainer.runs.sweep import SweepError, read_sweep


def sweep_file(tmp_path, shapes_dir, **body):
    base = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base.name, **body}))
    return path


def queued_values(runs_dir):
    runs = sorted(p for p in runs_dir.iterdir() if (p / "config.yaml").exists())
    return [RunDir(p).read_status() for p in runs]


def test_a_2x2_grid_queues_four_runs_with_the_right_values(tmp_path, shapes_dir):
    path = sweep_file(tmp_path, shapes_dir, name="lrbs", grid={"optimizer.lr": ["3e-4", 0.01],
                                                                "data.batch_size": [8, 16]})
    result = run_here("sweep", path, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    runs = [RunDir(line) for line in result.stdout.split()]
    assert len(runs) == 4
    seen = []
    for run in runs:
        cfg = yaml.safe_load(run.config.read_text())
        status = run.read_status()
        assert status["state"] == "queued" and status["queue"]["sweep"] == "lrbs"
        seen.append((cfg["optimizer"]["lr"], cfg["data"]["batch_size"]))
        assert (status["queue"]["values"]["data.batch_size"], cfg["train"]["epochs"]) == (cfg["data"]["batch_size"], 1)
    assert sorted(seen) == sorted([(3e-4, 8), (3e-4, 16), (0.01, 8), (0.01, 16)])


def test_a_random_sweep_is_reproducible_from_its_seed(tmp_path, shapes_dir):
    body = {"random": {"optimizer.lr": {"low": "1e-4", "high": 0.1, "log": True},
                       "data.batch_size": {"low": 8, "high": 64}}, "trials": 5, "seed": 7}
    first = read_sweep(sweep_file(tmp_path, shapes_dir, **body)).trials_values()
    again = read_sweep(sweep_file(tmp_path, shapes_dir, **body)).trials_values()
    other = read_sweep(sweep_file(tmp_path, shapes_dir, **{**body, "seed": 8})).trials_values()
    assert first == again and first != other and len(first) == 5
    assert all(1e-4 <= v["optimizer.lr"] <= 0.1 and isinstance(v["data.batch_size"], int) and
               8 <= v["data.batch_size"] <= 64 for v in first)


@pytest.mark.parametrize("body, message", [
    ({"grid": {"optimizer.lr": [0.1]}, "colour": 1}, "unknown key colour"),
    ({"grid": {}}, "grid: empty"),
    ({"grid": {"optimizer.lr": []}}, "grid.optimizer.lr: give a non-empty list"),
    ({"grid": {"optimizer.nonsense": [1, 2]}}, "optimizer.nonsense"),
    ({"grid": {"optimizer.lr": [0.1, -1]}}, "optimizer.lr: must be > 0"),
    ({"random": {"optimizer.lr": {"low": 0.1, "high": 0.01}}, "trials": 2}, "low (0.1) must be below high (0.01)"),
    ({"random": {"optimizer.lr": {"low": 0, "high": 0.1, "log": True}}}, "a log range needs low > 0"),
    ({"random": {"optimizer.lr": {"low": 0.001, "high": 0.1}}, "trials": 0}, "trials: must be a whole number"),
])
def test_bad_sweep_files_are_refused_by_name_and_nothing_is_queued(tmp_path, shapes_dir, body, message):
    path = sweep_file(tmp_path, shapes_dir, **body)
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_sweep(path)
    if body.get("colour"):  # and from the command line: exit 2, one line, nothing queued
        result = run_here("sweep", path, "--runs-dir", tmp_path / "runs")
        assert result.returncode == 2 and "unknown key colour" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_optuna_prunes_weak_trials(tmp_path, shapes_dir):
    pytest.importorskip("optuna")
    # long enough epochs (batch 4) and enough of them that a trial is still going when the pruner has read its first
    # epoch (the follower polls every half second; 3 epochs sometimes ended before it looked)
    base = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 6})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"base": base.name, "method": "optuna", "trials": 4, "seed": 0,
                                    "random": {"optimizer.lr": {"low": 1e-6, "high": 0.5, "log": True}}}))
    result = run_main("sweep", path, "--runs-dir", tmp_path / "runs", timeout=600)
    assert result.returncode == 0, result.stderr
    runs = [RunDir(line) for line in result.stdout.split()]
    statuses = [r.read_status() for r in runs]
    assert len(runs) == 4 and all(s["queue"]["sweep"] == "study" for s in statuses)
    pruned = [s for s in statuses if s.get("reason") == "pruned"]
    assert pruned and all(s["state"] == "stopped" and s["epoch"] < 6 for s in pruned), statuses
    assert any(s["state"] == "completed" for s in statuses)
    assert "best val_acc" in result.stderr


@pytest.mark.slow
def test_a_sweep_becomes_a_slurm_job_array_one_trial_per_task(tmp_path, shapes_dir):
    import os
    import subprocess

    from helpers import REPO

    path = sweep_file(tmp_path, shapes_dir, name="arr", grid={"optimizer.lr": [0.01, 0.02, 0.05]})
    result = run_here("slurm", path, "--out", tmp_path / "arr.sh")
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "arr.sh").read_text()
    assert "#SBATCH --array=1-3" in script and subprocess.run(["bash", "-n", tmp_path / "arr.sh"]).returncode == 0
    trials = sorted((tmp_path / "arr.trials").glob("trial-*.yaml"))
    assert [yaml.safe_load(t.read_text())["optimizer"]["lr"] for t in trials] == [0.01, 0.02, 0.05]
    # task 2, as SLURM would run it (here, locally): it trains trial 2 into RUNS/arr-002
    local = script.replace("export RUNS=", f"export RUNS={tmp_path / 'runs'} #", 1)
    task = subprocess.run(["bash", "-c", local], env={**os.environ, "SLURM_ARRAY_TASK_ID": "2"}, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert task.returncode == 0, task.stderr
    trained = RunDir(tmp_path / "runs" / "arr-002")
    assert yaml.safe_load(trained.config.read_text())["optimizer"]["lr"] == 0.02
    assert trained.read_status()["state"] == "completed"
