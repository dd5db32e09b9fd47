"""Runs on a host through a real sshd: mirrored byte for byte, a dropped connection costs nothing, Stop checkpoints
there and the run resumes, Export and Try it bring what they need home."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import REPO, run_here, run_main, simulated_device, write_config

from trainer.core.events import read_events

pytestmark = pytest.mark.slow


def start_remote_train(config: Path, local_runs: Path, host: str = "loop") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(config), "--host", host,
                             "--runs-dir", str(local_runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_mirror(local_runs: Path, host: str, event: str, proc: subprocess.Popen, timeout: float = 120) -> Path:
    """The mirror directory, once its events hold an `event`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for mirror in (local_runs / "remote" / host).glob("*"):
            events = mirror / "events.jsonl"
            if events.exists() and any(e.get("event") == event for e in read_events(events)):
                return mirror
        assert proc.poll() is None, f"the train command ended early: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"no {event} event mirrored in {timeout} s")


def kill_follow_connections(proc: subprocess.Popen) -> int:
    """Kill the ssh client that streams the run (what a dropped Wi-Fi or a sleeping laptop does to it)."""
    killed = 0
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "follow" in child.cmdline()[-1]:
                child.kill()
                killed += 1
        except (psutil.Error, IndexError):
            continue
    return killed


def test_a_host_run_is_mirrored_whole_through_a_dropped_connection_and_exports_home(hosts, shapes_dir, tmp_path):
    config = write_config(tmp_path, shapes_dir, train={"epochs": 6, "seed": 0}, monitor={"log_every": 1})
    proc = start_remote_train(config, hosts["local_runs"])
    mirror = wait_for_mirror(hosts["local_runs"], "loop", "step", proc)
    assert kill_follow_connections(proc) == 1
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "run completed" in out
    assert "connection to loop lost" in err and "reconnected to loop" in err

    remote = hosts["remote_runs"] / mirror.name
    assert (mirror / "events.jsonl").read_bytes() == (remote / "events.jsonl").read_bytes()  # nothing lost or twice
    steps = [e["step"] for e in read_events(mirror / "events.jsonl") if e["event"] == "step"]
    status = json.loads((mirror / "status.json").read_text())
    assert steps == list(range(1, status["step"] + 1))
    assert status["state"] == "completed" and status["remote"]["alive"] is False
    assert (mirror / "eval" / "val" / "metrics.json").read_text() == (remote / "eval" / "val" / "metrics.json").read_text()
    assert not (mirror / "checkpoints").exists()  # checkpoints stay there until asked for

    onnx = tmp_path / "home" / "model.onnx"
    done = run_here("export", mirror, "--format", "onnx", "--out", onnx)
    assert done.returncode == 0, done.stderr
    assert "fetching exports/model.onnx from loop: 100%" in done.stderr
    assert onnx.stat().st_size > 1000 and json.loads(onnx.with_name("model.onnx.json").read_text())["classes"]

    image = next(shapes_dir.glob("*/*.png"))
    for model in (mirror, onnx):  # Try it on the run (its checkpoint fetched) and on the exported file
        done = run_here("predict", model, image, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["top"][0][0] in ("circle", "cross", "square", "triangle")
    assert (mirror / "checkpoints" / "best.pt").exists()


def test_stop_checkpoints_on_the_host_and_the_run_resumes_from_here(hosts, shapes_dir, tmp_path):
    config = write_config(tmp_path, shapes_dir, train={"epochs": 40, "seed": 0})
    proc = start_remote_train(config, hosts["local_runs"])
    mirror = wait_for_mirror(hosts["local_runs"], "loop", "epoch", proc)
    proc.send_signal(signal.SIGTERM)  # the app's Stop
    out, err = proc.communicate(timeout=120)
    assert "run stopped" in out + err
    remote = hosts["remote_runs"] / mirror.name
    assert json.loads((mirror / "status.json").read_text())["state"] == "stopped"
    assert (remote / "checkpoints" / "last.pt").exists()
    stopped_at = json.loads((mirror / "status.json").read_text())["epoch"]
    assert 1 <= stopped_at < 40

    done = run_here("resume", mirror, "--epochs", str(stopped_at + 2))
    assert done.returncode == 0, done.stderr
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "completed" and status["epoch"] == stopped_at + 2
    assert (mirror / "events.jsonl").read_bytes() == (remote / "events.jsonl").read_bytes()


def test_stop_while_the_host_is_starting_the_run_stops_it_there_and_leaves_a_mirror(hosts, shapes_dir, tmp_path):
    """SIGTERM to `train --host` in its first second (the app's Stop during pre-flight) exited 143 with no word while
    the trainer went on there, with no mirror here: nobody could see or stop it."""
    config = write_config(tmp_path, shapes_dir, train={"epochs": 200}, monitor={"log_every": 1})
    proc = start_remote_train(config, hosts["local_runs"])
    def asked_to_start() -> bool:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                line = " ".join(child.cmdline())
            except psutil.Error:  # ended (or a zombie) while being looked at
                continue
            if "agent" in line and "start" in line:
                return True
        return False

    deadline = time.time() + 60
    while time.time() < deadline and not asked_to_start():
        time.sleep(0.05)  # until the host has been asked to start it: pre-flight there
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, (out, err)
    assert "stopping the run on loop: Stop came while it was starting" in out
    (mirror,) = list((hosts["local_runs"] / "remote" / "loop").iterdir())
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "stopped" and status["remote"]["alive"] is False
    remote = json.loads((hosts["remote_runs"] / mirror.name / "status.json").read_text())
    assert remote["state"] == "stopped", "stopped there, not left training"


def test_auto_on_a_host_plans_there_trains_there_and_brings_the_model_home(hosts, tmp_path):
    """`main.py auto FOLDER --labels FILE --host NAME`: the host's TrainDeck reads the labels file, probes and plans
    a multi-label run (its command, wrapped here, notes what it is asked), the plan comes back checked, and the run is
    a normal remote run with its export home, the thresholds in its card."""
    import yaml
    from helpers import digit_mosaics
    from remote_servers import REMOTE_COMMAND

    labels = digit_mosaics(tmp_path / "data", 400)  # the host's folder (one machine here: the same path)

    asked = tmp_path / "asked-on-the-host.txt"
    wrapper = tmp_path / "traindeck-on-the-host.sh"
    device = simulated_device(40)  # the host's clock: a simulated device (a slow one: a few epochs, a short test)
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {asked}\nexport TRAINDECK_SIMULATED_DEVICE={shlex.quote(device)}\n'
                       f'exec {REMOTE_COMMAND} "$@"\n')
    wrapper.chmod(0o755)
    entries = {**hosts["entries"], "gpubox": {**hosts["entries"]["loop"], "command": str(wrapper)}}
    hosts["file"].write_text(yaml.safe_dump({"hosts": entries}))

    stop_early = ["--set", "train.early_stop.patience=1", "train.early_stop.share=0"]  # not what this test is about
    done = run_main("auto", labels.parent, "--labels", labels, "--minutes", "0.5", "--host", "gpubox", "--runs-dir",
                    hosts["local_runs"], *stop_early, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = asked.read_text().splitlines()
    planned = [c.split() for c in commands if c.startswith(f"auto {labels.parent} ")]
    assert planned and {"--plan-only", "--labels", str(labels), "--minutes", "0.5"} <= set(planned[0]), commands
    assert any(c.startswith("agent start") for c in commands), "trained there"
    assert "auto: planning on gpubox" in done.stderr
    assert re.search(r"^device.host\s+gpubox\s", done.stdout, re.M), done.stdout

    (mirror,) = (hosts["local_runs"] / "remote" / "gpubox").iterdir()
    status = json.loads((mirror / "status.json").read_text())
    assert status["state"] == "completed", status
    choices = {c["key"]: c for c in json.loads((mirror / "auto.json").read_text())["choices"]}
    assert choices["device.host"]["value"] == "gpubox"
    assert "images/s" in choices["model.name"]["why"], "the host's own speed probe chose the network"
    config = yaml.safe_load((mirror / "config.yaml").read_text())
    assert config["train"]["budget"] > 0 and config["train"]["replan"], "Auto's budget and closed loop, there"
    assert config["data"]["labels"] == str(labels) and config["loss"]["name"] == "asl", "a multi-label plan"
    assert any("val_map" in e for e in read_events(mirror / "events.jsonl") if e["event"] == "epoch")
    onnx = mirror / "exports" / "model.onnx"
    assert f"exported: {onnx}" in done.stdout
    card = json.loads((mirror / "exports" / "model.onnx.json").read_text())
    assert onnx.stat().st_size > 1000 and card["task"] == "multilabel" and len(card["thresholds"]) == 10
