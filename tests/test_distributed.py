"""DDP on CPU with gloo, for real: torchrun, mp.spawn, two 'nodes' on loopback, a rank killed mid-run, AMP."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from helpers import (
    REPO,
    poisoned_model,
    process_tree_gone,
    run_here,
    run_main,
    train_here,
    trusted_model,
    wait_for_event,
    write_config,
)

from trainer.core.config import ConfigError, RunConfig
from trainer.core.events import read_events
from trainer.core.rundir import RunDir
from trainer.data.demo_data import write_demo_dataset
from trainer.model.checkpoint import load_weights_only

PLAIN_MODEL = """
import torch
from torch import nn

class Plain(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(self.body(x))
"""


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "shapes", per_class=150, size=32, seed=3)


def ddp_sets(launcher, nproc=2, **extra):
    sets = ["device.parallel=ddp", f"device.launcher={launcher}", f"device.nproc={nproc}"]
    return sets + [f"{k}={v}" for k, v in extra.items()]


@pytest.fixture(scope="module")
def held_out_dirs(tmp_path_factory):
    """Validation and test folders of the demo shapes, drawn apart from the training folder's."""
    root = tmp_path_factory.mktemp("held_out")
    return (write_demo_dataset(root / "v", per_class=40, size=32, seed=11),
            write_demo_dataset(root / "t", per_class=40, size=32, seed=12))


def predictions(folder) -> dict[str, str]:
    import csv

    return {row["path"]: row["predicted"] for row in csv.DictReader(open(folder / "predictions.csv"))}


# The launchers share the training code, but each starts its ranks its own way: both are checked against one process,
# torchrun (env://) by what its run reports and evaluates here, mp.spawn (tcp://) weight by weight after one epoch.
@pytest.mark.slow
def test_two_ranks_train_well_and_their_results_are_the_single_process_answer(demo_dir, held_out_dirs, tmp_path):
    """The Results tab reads eval/val and eval/test: under DDP they must say what the epoch said (val_acc) and what
    one process says of the same checkpoint (`main.py evaluate`), image by image (they read 42% beside 93%)."""
    val_dir, test_dir = held_out_dirs
    cfg = write_config(tmp_path, demo_dir, data={"image_size": 24, "batch_size": 16, "val_dir": str(val_dir),
                                                 "test_dir": str(test_dir)},
                       train={"epochs": 4}, optimizer={"lr": 0.05}, monitor={"log_every": 5})
    run = tmp_path / "run"
    result = run_main("train", cfg, "--run-dir", run, "--set", *ddp_sets("torchrun", **{"device.init_method": "env"}),
                      timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = read_events(run / "events.jsonl")
    start = next(e for e in events if e["event"] == "run_start")
    assert start["world_size"] == 2 and "DDP x2 (gloo" in start["device"]
    assert sum(1 for e in events if e["event"] == "run_start") == 1, "rank 0 alone writes events"
    best = RunDir(run).read_status()["best_acc"]
    assert best >= 0.8, f"best val_acc {best}"  # one process: 0.887, DDP 0.856
    state = load_weights_only(run / "checkpoints" / "last.pt")
    assert not any(k.startswith("module.") for k in state["model"]), "checkpoints hold the unwrapped model"
    val = json.loads((run / "eval" / "val" / "metrics.json").read_text())
    assert val["images"] == start["val_size"] == 160 and val["accuracy"] == pytest.approx(best, abs=1e-6)
    best_epoch = max((e for e in events if e["event"] == "epoch"), key=lambda e: e["val_acc"])
    assert val["epoch"] == best_epoch["epoch"] and val["confusion"] == best_epoch["confusion"]
    for split, folder in (("val", val_dir), ("test", test_dir)):  # one process, the same best.pt
        single = run_here("evaluate", run, "--data", folder, "--name", f"single-{split}")  # in one process
        assert single.returncode == 0, single.stderr[-2000:]
        assert predictions(run / "eval" / split) == predictions(run / "eval" / f"single-{split}"), split


@pytest.mark.slow
def test_one_ddp_epoch_started_by_mp_spawn_equals_one_single_process_epoch(shapes_dir, tmp_path):
    model = trusted_model(tmp_path / "plain.py", PLAIN_MODEL, "Plain")
    common = dict(data={"image_size": 16, "augment": {"hflip": False, "random_resized_crop": False}},
                  # fp32: a bf16 result depends on the batch shape each rank computes, so it would differ by rounding
                  model={"name": model}, train={"epochs": 1, "amp": "none"}, scheduler={"name": "none"},
                  optimizer={"lr": 0.05, "groups": [{"pattern": "fc", "lr": 0.1}]})
    single_cfg = write_config(tmp_path, shapes_dir, **common)
    single, code = train_here(single_cfg, tmp_path / "single", ["data.batch_size=8"])  # the reference, in this process
    assert code == 0, single.tail_log()
    result = run_main("train", single_cfg, "--run-dir", tmp_path / "ddp", "--set", "data.batch_size=4",
                      *ddp_sets("spawn", **{"device.init_method": "tcp"}))
    assert result.returncode == 0, result.stderr[-3000:]
    a = load_weights_only(single.checkpoints / "last.pt")
    b = load_weights_only(tmp_path / "ddp" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 12
    for key, value in a["model"].items():
        assert not torch.equal(value, torch.zeros_like(value))
        torch.testing.assert_close(b["model"][key], value, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.slow
def test_two_nodes_on_loopback_complete_a_run_together(shapes_dir, tmp_path):
    from trainer.runs.launch import free_port

    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 1})
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir",
                               str(tmp_path / f"node{rank}"), "--set", *ddp_sets("torchrun", nproc=1),
                               "device.nnodes=2", f"device.node_rank={rank}", f"device.master_port={port}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    start = next(e for e in read_events(tmp_path / "node0" / "events.jsonl") if e["event"] == "run_start")
    assert start["world_size"] == 2
    assert not (tmp_path / "node1" / "events.jsonl").exists(), "only global rank 0 writes events"


@pytest.mark.slow
def test_killing_one_rank_fails_the_run_and_names_it(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 2}, train={"epochs": 50},
                       monitor={"log_every": 1})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(run_dir),
                             "--set", *ddp_sets("torchrun"), "device.timeout_s=20"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if (run_dir / "events.jsonl").exists() and any(
                    e["event"] == "step" for e in read_events(run_dir / "events.jsonl")):
                break
            time.sleep(0.1)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RANK" in p.environ()]
        rank1 = next(p for p in workers if p.environ()["RANK"] == "1")
        rank1.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=180)  # a hang guard; rank 0 noticed rank 1's death (the status names it)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    status = RunDir(run_dir).read_status()
    assert status["state"] == "failed"
    assert "rank 1" in status["message"] and "SIGKILL" in status["message"], status["message"]
    deadline = time.time() + 10
    while not process_tree_gone(proc.pid, workers) and time.time() < deadline:
        time.sleep(0.2)
    assert process_tree_gone(proc.pid, workers)


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_with_restarts_left_restarts_the_group_from_the_last_checkpoint(shapes_dir,
                                                                                                     tmp_path):
    """device.max_restarts 1 (torchrun --max-restarts): rank 1 killed with SIGKILL mid-epoch, after a checkpoint; the
    group starts again from that checkpoint and completes; the events say so once."""
    cfg = write_config(tmp_path, shapes_dir, data={"batch_size": 4}, train={"epochs": 2},
                       monitor={"log_every": 1}, checkpoint={"every_steps": 4})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(run_dir),
                             "--set", *ddp_sets("torchrun"), "device.timeout_s=20", "device.max_restarts=1"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        saved = wait_for_event(run_dir, lambda e: e["event"] == "checkpoint" and e["mid_epoch"] and e["step"] >= 4,
                               proc=proc)
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RANK" in p.environ()]
        next(p for p in workers if p.environ()["RANK"] == "1").send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=240)  # a hang guard
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    status = RunDir(run_dir).read_status()
    assert status["state"] == "completed", status
    events = read_events(run_dir / "events.jsonl")
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["by"] == "torchrun" and restarts[0]["count"] == 1, restarts
    assert restarts[0]["step"] >= saved["step"] and restarts[0]["checkpoint"], restarts[0]
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[1]["resumed_from"] and starts[1]["start_step"] == restarts[0]["step"]
    assert [e["epoch"] for e in events if e["event"] == "epoch"][-1] == 2


@pytest.mark.slow
def test_bf16_autocast_on_cpu_tracks_fp32(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, train={"epochs": 3})
    losses = {}
    for amp in ("none", "bf16"):  # in this process: a subprocess would show nothing more of autocast
        run, code = train_here(cfg, tmp_path / amp, [f"train.amp={amp}"])
        assert code == 0, run.tail_log()
        epochs = [e for e in read_events(run.events) if e["event"] == "epoch"]
        losses[amp] = [e["train_loss"] for e in epochs]
    for fp32, bf16 in zip(losses["none"], losses["bf16"]):
        assert abs(bf16 - fp32) < 0.25 * fp32 + 0.05, losses


NO_GPU_NO_HOROVOD = {"gpus": [], "bf16_cuda": False, "bf16_cuda_supported": False, "bf16_cpu": False,
                     "backends": {"gloo": True, "nccl": False, "mpi": False}, "horovod": False}
TWO_GPUS_HOROVOD = {**NO_GPU_NO_HOROVOD, "gpus": [{"index": 0, "name": "G", "memory_gb": 80},
                                                  {"index": 1, "name": "G", "memory_gb": 80}],
                    "bf16_cuda": True, "bf16_cuda_supported": True, "horovod": True,
                    "backends": {"gloo": True, "nccl": True, "mpi": False}}


@pytest.mark.parametrize(("facts", "refused"), [(NO_GPU_NO_HOROVOD, True), (TWO_GPUS_HOROVOD, False)])
def test_options_a_machine_lacks_fail_before_launch(shapes_dir, tmp_path, monkeypatch, capsys, facts, refused):
    """On canned machine facts (whatever this machine has): cuda, DataParallel and Horovod are refused with the
    key, the reason and the install command before any run directory exists, and accepted where the machine has
    them."""
    from trainer import cli
    from trainer.device import machine

    monkeypatch.setattr(machine, "machine_facts", lambda: facts)
    cfg = write_config(tmp_path, shapes_dir)
    runs = tmp_path / "runs"
    asks = {"cuda": ["device.type=cuda"], "dp": ["device.type=cuda", "device.parallel=dp", "device.gpus=[0,1]"],
            "horovod": list(ddp_sets("horovod"))}
    expected = {"cuda": "device.type: cuda, but no CUDA GPU is available",
                "dp": "device.type: cuda, but no CUDA GPU is available",
                "horovod": "device.launcher: horovod is not installed here (pip install 'horovod[pytorch]'"}
    for option, sets in asks.items():
        if refused:
            assert cli.main(["train", str(cfg), "--runs-dir", str(runs), "--set", *sets]) == 2, option
            err = capsys.readouterr().err
            assert expected[option] in err and "Traceback" not in err, (option, err)
        else:
            from trainer.core.config import load_config
            from trainer.device.machine import check_device

            check_device(load_config(cfg, sets))  # no refusal on a machine that has them
    assert not runs.exists()
    with pytest.raises(ConfigError, match="train.sync_batchnorm: SyncBatchNorm runs on GPUs only"):
        RunConfig.from_dict({"device": {"parallel": "ddp"}, "train": {"sync_batchnorm": True}})


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DataParallel needs at least 2 CUDA GPUs")
def test_data_parallel_on_two_gpus(shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, device={"type": "cuda", "gpus": [0, 1], "parallel": "dp"})
    result = run_main("train", cfg, "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "DataParallel" in next(e for e in read_events(tmp_path / "run" / "events.jsonl")
                                  if e["event"] == "run_start")["device"]


STAND_INS = REPO / "tests" / "stand_ins"


@pytest.mark.slow
def test_horovod_wiring_trains_like_one_process(shapes_dir, tmp_path):
    """Through a stand-in `horovod` package (tests/stand_ins) built on gloo: horovodrun starts 2 workers, each calls
    hvd.init, wraps the optimizer in DistributedOptimizer and receives rank 0's parameters and optimizer state;
    one epoch then equals one single-process epoch on the same global batch."""
    model = trusted_model(tmp_path / "plain.py", PLAIN_MODEL, "Plain")
    cfg = write_config(tmp_path, shapes_dir, model={"name": model}, scheduler={"name": "none"},
                       data={"image_size": 16, "augment": {"hflip": False, "random_resized_crop": False}},
                       train={"epochs": 1, "amp": "none"}, optimizer={"lr": 0.05})
    single, code = train_here(cfg, tmp_path / "single", ["data.batch_size=8"])  # the reference, in this process
    assert code == 0, single.tail_log()
    calls = tmp_path / "horovod-calls.log"
    env = dict(os.environ, PYTHONPATH=str(STAND_INS), HOROVOD_STANDIN_LOG=str(calls))
    result = run_main("train", cfg, "--run-dir", tmp_path / "hvd", "--set", "data.batch_size=4",
                      *ddp_sets("horovod"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    start = next(e for e in read_events(tmp_path / "hvd" / "events.jsonl") if e["event"] == "run_start")
    assert start["world_size"] == 2 and start["device"] == "Horovod x2 (cpu)"
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("launcher -np 2 -H localhost:2")
    for rank in (0, 1):
        for call in ("init", "DistributedOptimizer backward_passes_per_step=1", "broadcast_parameters",
                     "broadcast_optimizer_state"):
            assert f"{rank} {call}" in lines, (rank, call, lines)
    a = load_weights_only(single.checkpoints / "last.pt")
    b = load_weights_only(tmp_path / "hvd" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 12
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank_alike(shapes_dir, tmp_path):
    """The decision is taken from the all-reduced flag: both ranks stop as diverged at the same step, neither
    waits in a collective for the other (the run ends long before device.timeout_s)."""
    model = poisoned_model(tmp_path, "nan", (3,), where="output", rank=1)
    cfg = write_config(tmp_path, shapes_dir, model={"name": model}, train={"epochs": 3},
                       monitor={"log_every": 4, "grad_stats": False})
    result = run_main("train", cfg, "--run-dir", tmp_path / "run", "--set",
                      *ddp_sets("spawn", **{"device.init_method": "tcp"}), "device.timeout_s=60", timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    status = RunDir(tmp_path / "run").read_status()
    assert status["state"] == "diverged" and "non-finite loss" in status["message"], status
    events = read_events(tmp_path / "run" / "events.jsonl")
    started = next(e["time"] for e in events if e["event"] == "run_start")  # the trainer's own clock, a few steps
    assert events[-1]["event"] == "run_end" and events[-1]["time"] - started < 60, "a rank waited device.timeout_s"
    assert "[rank 1] ERROR training diverged" in result.stderr, "rank 1 took the same decision"
    assert not list((tmp_path / "run").glob("rank-*.error")), "no rank failed on its own"


@pytest.mark.slow
def test_slurm_script_trains_exactly_the_config_asked_for(shapes_dir, tmp_path):
    """The srun payload of the generated script, run here for one node on CPU/gloo, trains the resolved config
    with every --set override, under the interpreter the script names."""
    import re
    import shlex

    from trainer.core.config import load_config
    from trainer.runs.launch import free_port

    cfg_path = write_config(tmp_path, shapes_dir, device={"type": "cuda", "gpus": [0, 1, 2, 3]})
    sets = ["device.nnodes=2", "device.nproc=2", "device.parallel=ddp", "device.type=cpu", "device.gpus=[0]",
            f"device.master_port={free_port()}", "optimizer.lr=0.0123", "train.epochs=1", "data.num_workers=1"]
    script_path = tmp_path / "job" / "train.sh"
    script_path.parent.mkdir()
    runs = tmp_path / "runs"
    result = run_main("slurm", cfg_path, "--set", *sets, "--out", script_path, env=dict(os.environ, TRAINDECK_RUNS=str(runs)))
    assert result.returncode == 0, result.stderr
    script = script_path.read_text()
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    assert "#SBATCH --nodes=2" in script and "#SBATCH --cpus-per-task=4\n" in script  # 2 processes x (1 worker + 1)
    assert f"export PYTHON={shlex.quote(sys.executable)}" in script
    config = shlex.split(re.search(r"^export CONFIG=(.*)$", script, re.M).group(1))[0]
    resolved = load_config(config)
    assert resolved.to_dict() == load_config(cfg_path, sets).to_dict()

    payload = re.search(r"srun [^']*bash -c '(.*?)' \|\| code=", script, re.S).group(1)
    env = dict(os.environ, PYTHON=sys.executable, CONFIG=config, SLURM_JOB_ID="4242", SLURM_NODEID="0",
               SLURM_NNODES="1", MASTER_ADDR="127.0.0.1")
    assert f"export RUNS={runs}" in script
    env["RUNS"] = str(runs)
    ran = subprocess.run(["bash", "-c", payload], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    start = next(e for e in read_events(runs / "slurm-4242" / "events.jsonl") if e["event"] == "run_start")
    expected = resolved.with_overrides(["device.nnodes=1", "device.node_rank=0", "device.master_addr=127.0.0.1"])
    asked = expected.to_dict()
    for decided in start["augment"]:  # the config's auto augmentation, decided by the trainer for the data
        section, key = decided["key"].removeprefix("data.").split(".")
        assert asked["data"][section][key] == "auto"
        asked["data"][section][key] = decided["value"]
    assert start["config"] == asked
    assert start["world_size"] == 2 and start["config"]["optimizer"]["lr"] == 0.0123


def test_per_node_commands(shapes_dir, tmp_path):
    from trainer.core.config import load_config
    from trainer.runs.launch import node_commands

    cfg_path = write_config(tmp_path, shapes_dir, device={"nnodes": 3, "master_port": 29512, "parallel": "ddp"})
    commands = node_commands(cfg_path, load_config(cfg_path))
    assert len(commands) == 3 and all(f"device.node_rank={i}" in c for i, c in enumerate(commands))


def test_slurm_asks_for_no_more_cpus_than_the_config_does(shapes_dir, tmp_path, capsys):
    """`main.py slurm cfg --set device.parallel=ddp device.nproc=2` asked 10 CPUs (an assumed 4 workers each) and
    pended forever on a 2-CPU node (PartitionConfig). With data.num_workers auto it asks one per process; a set
    worker count is honoured and a large request says so; --cpus-per-task overrides."""
    from trainer import cli

    cfg_path = write_config(tmp_path, shapes_dir, data={"num_workers": -1})
    ddp = ["device.parallel=ddp", "device.nproc=2"]

    def script(*extra) -> str:
        out = tmp_path / "job.sh"
        flags = [f for f in extra[:1] if f]
        assert cli.main(["slurm", str(cfg_path), "--set", *ddp, *extra[1:], "--out", str(out), *flags]) == 0
        return out.read_text()

    assert "#SBATCH --cpus-per-task=2\n# cpus-per-task: 2 process(es), one CPU each" in script(None)
    assert "#SBATCH --cpus-per-task=6\n" in script(None, "data.num_workers=2")
    big = script(None, "device.nproc=8", "data.num_workers=4")
    assert "#SBATCH --cpus-per-task=40\n" in big and "A large request" in big and "PartitionConfig" in big
    assert "#SBATCH --cpus-per-task=3\n# cpus-per-task: --cpus-per-task as given" in script("--cpus-per-task=3")
    assert cli.main(["slurm", str(cfg_path), "--cpus-per-task", "0"]) == 2
    assert "--cpus-per-task: must be at least 1" in capsys.readouterr().err
