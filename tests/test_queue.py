"""The run queue: a scheduler that keeps going past a failed run, survives being killed, never starts a run twice,
and places runs on GPUs that are free."""

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, run_here, run_main, write_config

from trainer.core.config import RunConfig, load_config
from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.runs import queue


def states(runs):
    return [RunDir(r).read_status().get("state") for r in runs]


def add(cfg, runs_dir, *overrides):
    result = run_here("queue", "add", cfg, "--runs-dir", runs_dir, *(["--set", *overrides] if overrides else []))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_the_queue_keeps_going_past_a_failed_run(tmp_path, shapes_dir):
    doomed = tmp_path / "doomed"
    shutil.copytree(shapes_dir, doomed)
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    runs_dir = tmp_path / "runs"
    first = add(cfg, runs_dir)
    middle = add(cfg, runs_dir, f"data.train_dir={doomed}")
    last = add(cfg, runs_dir)
    assert states([first, middle, last]) == ["queued"] * 3
    listed = run_here("queue", "list", "--runs-dir", runs_dir)
    assert [line.split("\t")[1] for line in listed.stdout.splitlines()] == [first, middle, last]
    shutil.rmtree(doomed)  # the middle run's data is gone by the time it starts
    result = run_main("queue", "run", "--runs-dir", runs_dir, "--until-empty", timeout=300)
    assert result.returncode == 0, result.stderr
    assert states([first, middle, last]) == ["completed", "failed", "completed"]
    assert "data.train_dir" in RunDir(middle).read_status()["message"]
    bad = run_here("queue", "add", cfg, "--runs-dir", runs_dir, "--set", "optimizer.lr=-1")
    assert bad.returncode == 2 and "optimizer.lr" in bad.stderr
    assert len([p for p in runs_dir.iterdir() if (p / "config.yaml").exists()]) == 3  # nothing queued


@pytest.mark.slow
def test_a_killed_scheduler_s_run_resumes_from_its_checkpoint(tmp_path, shapes_dir):
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 4}, monitor={"log_every": 1})
    runs_dir = tmp_path / "runs"
    run = RunDir(add(cfg, runs_dir))
    scheduler = subprocess.Popen([sys.executable, str(REPO / "main.py"), "queue", "run", "--runs-dir", str(runs_dir)],
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
    try:
        deadline = time.time() + 120
        while not list(run.checkpoints.glob("ckpt-e0001*")) and time.time() < deadline:
            time.sleep(0.2)
        assert list(run.checkpoints.glob("ckpt-e0001*")), run.read_status()
        trainer_pid = run.read_status()["pid"]
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait()
        psutil.Process(trainer_pid).wait(timeout=60)  # it got SIGTERM when the scheduler died: checkpoint, stop
        assert run.read_status()["state"] == "stopped"
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
    result = run_main("queue", "run", "--runs-dir", runs_dir, "--until-empty", timeout=300)
    assert result.returncode == 0, result.stderr
    assert run.read_status()["state"] == "completed"
    starts = [e for e in read_events(run.events) if e["event"] == "run_start"]
    assert len(starts) >= 2 and starts[-1]["resumed_from"] and starts[-1]["start_epoch"] >= 1
    assert [p.name for p in runs_dir.iterdir() if (p / "config.yaml").exists()] == [run.name]  # no duplicate run
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(run.path) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
def test_two_schedulers_start_each_run_exactly_once(tmp_path, shapes_dir):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    runs_dir = tmp_path / "runs"
    runs = [add(cfg, runs_dir) for _ in range(3)]
    command = [sys.executable, str(REPO / "main.py"), "queue", "run", "--runs-dir", str(runs_dir), "--until-empty"]
    both = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for p in both:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    assert states(runs) == ["completed"] * 3
    for r in runs:
        assert len([e for e in read_events(RunDir(r).events) if e["event"] == "run_start"]) == 1


def gpu(index, used=0, util=0, total=80_000):
    return {"index": index, "memory_used_mb": used, "memory_total_mb": total, "utilization": util}


def test_placement_gives_disjoint_gpus_waits_and_avoids_busy_ones():
    two = RunConfig.from_dict({"device": {"type": "cuda", "gpus": [0, 1]}})
    one = RunConfig.from_dict({"device": {"type": "cuda", "gpus": [0]}})
    cpu = RunConfig()
    usage = [gpu(0), gpu(1), gpu(2), gpu(3)]
    assert queue.place(two, [], usage, 1) == [0, 1]
    assert queue.place(two, [{"gpus": [0, 1]}], usage, 1) == [2, 3]  # disjoint from the running run's
    assert queue.place(two, [{"gpus": [0, 1]}, {"gpus": [2]}], usage, 1) is None  # only GPU 3 free: wait
    assert queue.place(one, [{"gpus": [0, 1]}, {"gpus": [2]}], usage, 1) == [3]
    # someone else's job: 95% busy on GPU 0, 30 GB of 80 held on GPU 1; both passed over
    others = [gpu(0, util=95), gpu(1, used=30_000), gpu(2), gpu(3, used=2_000, util=5)]
    assert queue.busy_gpus(others, set()) == {0, 1}
    assert queue.place(two, [], others, 1) == [2, 3]
    assert queue.place(one, [{"gpus": [2, 3]}], others, 1) is None
    # a GPU our own run keeps busy is ours, not someone else's
    assert queue.busy_gpus([gpu(0, util=99)], {0}) == set()
    # CPU runs: as many at a time as configured
    assert queue.place(cpu, [], [], 1) == [] and queue.place(cpu, [{"gpus": []}], [], 1) is None
    assert queue.place(cpu, [{"gpus": []}], [], 2) == []
    assert load_config  # the scheduler reads each run's own config.yaml


def test_queue_controls_reorder_hold_remove_retry(tmp_path, shapes_dir):
    cfg = load_config(write_config(tmp_path, shapes_dir))
    runs_dir = tmp_path / "runs"
    a, b, c = (queue.add(runs_dir, cfg) for _ in range(3))
    queue.move(runs_dir, c, 0)
    assert [r.path for r in queue.queued(runs_dir)] == [c.path, a.path, b.path]
    queue.hold(runs_dir, a)
    assert a.read_status()["queue"]["held"] is True
    queue.remove(runs_dir, b)
    assert b.read_status()["state"] == "stopped" and [r.path for r in queue.queued(runs_dir)] == [c.path, a.path]
    with pytest.raises(ValueError, match="not waiting"):
        queue.hold(runs_dir, b)
    queue.retry(runs_dir, b)
    assert [r.path for r in queue.queued(runs_dir)] == [c.path, a.path, b.path]
    assert os.path.exists(b.config)


def test_nvml_figures_include_other_users_memory_and_mark_busy_gpus(monkeypatch):
    """gpu_usage reads NVML (a stand-in module here: no GPU on this machine) and the Device page shows it."""
    import types

    from app.pages.device_page import gpu_line

    class Memory:
        def __init__(self, used, total):
            self.used, self.total = used, total

    devices = {0: (Memory(60 * 2**30, 80 * 2**30), 97), 1: (Memory(1 * 2**30, 80 * 2**30), 0)}
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: devices[h][0],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=devices[h][1]),
        nvmlDeviceGetName=lambda h: b"NVIDIA H200")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    usage = queue.gpu_usage()
    assert [round(u["memory_used_mb"]) for u in usage] == [60 * 1024, 1024] and usage[0]["name"] == "NVIDIA H200"
    assert queue.busy_gpus(usage, set()) == {0}
    cfg = RunConfig.from_dict({"device": {"type": "cuda", "gpus": [0]}})
    assert queue.place(cfg, [], usage, 1) == [1]  # GPU 0 is someone else's job
    line = gpu_line({"index": 0, "name": "NVIDIA H200", "memory_gb": 80.0}, usage[0], True)
    assert "97% busy, 60.0/80.0 GB in use" in line and "busy with another job" in line


def test_the_scheduler_waits_while_a_run_started_elsewhere_is_still_going(tmp_path, shapes_dir, monkeypatch):
    """Issue #71: the scheduler started a queued run while the window's Auto run was still exporting (two jobs on two
    cores). A run started from the window or a command line holds its place until its process ends."""
    from trainer.core.config import save_config
    from trainer.core.rundir import new_run_dir

    cfg = load_config(write_config(tmp_path, shapes_dir))
    runs_dir = tmp_path / "runs"
    windows_run = new_run_dir(runs_dir, "from-the-window")
    save_config(cfg, windows_run.config)
    windows_run.write_status(state="running", pid=os.getpid(), message="exporting")  # alive: this process
    waiting = queue.add(runs_dir, cfg)
    started = []
    scheduler = queue.Scheduler(runs_dir, cpu_slots=1, usage=lambda: [], log=lambda *_: None)
    monkeypatch.setattr(scheduler, "_launch", lambda run, cfg, gpus: started.append(run.path))
    assert scheduler.start_what_fits() == 0 and started == []
    windows_run.write_status(state="completed", ended=time.time())  # recorded its end, its process still exiting
    assert scheduler.start_what_fits() == 0 and started == []
    windows_run.write_status(ended=time.time() - 2 * queue.ENDING_S)  # long ago: that pid is another process's now
    assert scheduler.start_what_fits() == 1 and started == [waiting.path]
