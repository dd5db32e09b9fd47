"""Starting from pretrained weights, without a network: torchvision files seeded into a temporary TORCH_HOME (under
torchvision's own file names), timm weights into a temporary Hugging Face cache, downloads from a local server."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import torchvision
from helpers import REPO, run_here, train_here, write_config

from trainer import cli
from trainer.core.events import read_events
from trainer.core.rundir import list_runs
from trainer.model.checkpoint import load_weights_only
from trainer.model.weights import sha256_of

RESNET18_FILE = "resnet18-f37072fd.pth"  # torchvision's name for ResNet18_Weights.IMAGENET1K_V1


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test (and looks like an offline machine to the code)."""
    attempts = []

    def refuse(self, address):
        attempts.append(address)
        raise OSError(101, "Network is unreachable (test: no network)")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def seed_resnet18(torch_home) -> dict:
    torch.manual_seed(123)
    state = torchvision.models.resnet18(num_classes=1000).state_dict()
    for key, value in state.items():  # distinctive running statistics, so "unchanged" means something
        if key.endswith("running_var"):
            value.uniform_(0.5, 2.0)
        elif key.endswith("running_mean"):
            value.normal_()
    torch.save(state, torch_home / "hub" / "checkpoints" / RESNET18_FILE)
    return state


def pretrained_config(tmp_path, shapes_dir, **model):
    return write_config(tmp_path, shapes_dir, model={"name": "resnet18", "weights": "DEFAULT", **model},
                        data={"image_size": 32}, scheduler={"name": "none"}, optimizer={"lr": 0.05},
                        checkpoint={"keep_last": 5})


def backbone_equal(model_state: dict, file_state: dict) -> bool:
    return all(torch.equal(model_state[k], v) for k, v in file_state.items() if not k.startswith("fc."))


def test_a_cached_file_is_used_with_no_network_and_a_linear_probe_changes_only_the_head(
        torch_home, no_network, shapes_dir, tmp_path):
    file_state = seed_resnet18(torch_home)
    cfg = pretrained_config(tmp_path, shapes_dir, freeze_backbone=True)
    run, code = train_here(cfg, tmp_path / "runs", ["train.epochs=1"])
    assert code == 0, run.tail_log()
    assert no_network == [], "a cached file needs no network"
    events = read_events(run.events)
    start = next(e for e in events if e["event"] == "run_start")
    path = torch_home / "hub" / "checkpoints" / RESNET18_FILE
    assert start["weights"] == {"name": "IMAGENET1K_V1", "file": str(path), "sha256": sha256_of(path),
                                "url": torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url}
    transform = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.transforms()
    assert start["mean"] == list(transform.mean) and start["std"] == list(transform.std)
    assert "IMAGENET1K_V1 weights of resnet18" in start["normalisation"]
    assert start["frozen"]["backbone"] and start["trainable"] == 512 * 4 + 4, "only the resized head trains"
    trained = load_weights_only(run.checkpoints / "last.pt")
    assert trained["model"]["fc.weight"].shape == (4, 512)
    assert backbone_equal(trained["model"], file_state), "backbone weights and BatchNorm statistics unchanged"
    assert trained["preprocess"]["mean"] == list(transform.mean)
    assert "loaded resnet18 weights IMAGENET1K_V1" in run.log.read_text()


def test_offline_and_not_cached_names_the_file_its_url_and_the_folder(torch_home, no_network, shapes_dir, tmp_path,
                                                                     capsys):
    cfg = pretrained_config(tmp_path, shapes_dir)
    code = cli.main(["train", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--set", "train.epochs=1"])
    err = capsys.readouterr().err
    assert code == 2, err
    url = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    assert "not in the cache and cannot be downloaded" in err and url in err and RESNET18_FILE in err
    assert str(torch_home / "hub" / "checkpoints") in err and "main.py fetch-weights resnet18 IMAGENET1K_V1" in err
    assert "Traceback" not in err
    (run,) = list_runs(tmp_path / "runs")
    phases = [e.get("phase") for e in read_events(run.events) if e["event"] == "prepare"]
    assert "scan" not in phases and "cache" not in phases, f"it failed at once, before decoding images: {phases}"


@pytest.mark.parametrize(("weights", "expected"), [
    ("IMAGENET9K", "model.weights: resnet18 has no weights 'IMAGENET9K' (available: DEFAULT, IMAGENET1K_V1)"),
    ("DEFAULT", "model.weights: DEFAULT: small_cnn has no published weights"),
])
def test_unknown_weights_names_are_refused_before_launch(shapes_dir, tmp_path, capsys, weights, expected):
    model = "small_cnn" if "small_cnn" in expected else "resnet18"
    cfg = write_config(tmp_path, shapes_dir, model={"name": model, "weights": weights})
    code = cli.main(["train", str(cfg), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert not (tmp_path / "runs").exists()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def weights_server(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def serve_resnet18(folder, monkeypatch, base_url, damaged=False):
    """A generated resnet18 state_dict served under a torchvision-style name with its true hash prefix; resolve()
    points the weights at it (as a mirror would)."""
    import trainer.model.weights

    torch.manual_seed(7)
    state = torchvision.models.resnet18(num_classes=1000).state_dict()
    tmp = folder / "tmp.pth"
    torch.save(state, tmp)
    digest = sha256_of(tmp)[:8]
    name = f"resnet18-{'00000000' if damaged else digest}.pth"
    tmp.rename(folder / name)
    real_resolve = trainer.model.weights.resolve

    def resolve(model_name, weights):
        named = real_resolve(model_name, weights)
        if model_name == "resnet18":
            named.url = f"{base_url}/{name}"
        return named

    monkeypatch.setattr(trainer.model.weights, "resolve", resolve)
    return name, state


@pytest.mark.slow
def test_fetch_weights_downloads_into_the_hub_cache_with_progress(torch_home, weights_server, monkeypatch, capsys):
    folder, url = weights_server
    name, state = serve_resnet18(folder, monkeypatch, url)
    assert cli.main(["fetch-weights", "resnet18"]) == 0
    out, err = capsys.readouterr()
    cached = torch_home / "hub" / "checkpoints" / name
    assert out.strip() == str(cached) and cached.is_file()
    assert f"{name}: " in err and "MB" in err.splitlines()[-1]
    assert all(torch.equal(load_weights_only(cached)[k], v) for k, v in state.items())
    assert not list(cached.parent.glob(".*.part")), "no partial download left"
    assert cli.main(["fetch-weights", "resnet18"]) == 0 and "already cached" in capsys.readouterr().out


def test_a_damaged_download_is_refused_and_not_kept(torch_home, weights_server, monkeypatch, capsys):
    folder, url = weights_server
    name, _ = serve_resnet18(folder, monkeypatch, url, damaged=True)
    assert cli.main(["fetch-weights", "resnet18"]) == 2
    assert "arrived damaged" in capsys.readouterr().err
    assert not list((torch_home / "hub" / "checkpoints").iterdir())


def test_a_run_downloads_with_progress_events(torch_home, weights_server, monkeypatch, shapes_dir, tmp_path):
    folder, url = weights_server
    serve_resnet18(folder, monkeypatch, url)
    cfg = pretrained_config(tmp_path, shapes_dir)
    run, code = train_here(cfg, tmp_path / "runs", ["train.epochs=1"])
    assert code == 0, run.tail_log()
    progress = [e for e in read_events(run.events) if e["event"] == "prepare" and e["phase"] == "weights"]
    assert progress and progress[-1]["done"] == progress[-1]["total"] > 40e6
    assert "downloading pretrained weights" in progress[-1]["message"]


class SlowHandler(http.server.BaseHTTPRequestHandler):
    """A mirror that sends a 45 MB file under torchvision's own name, a megabyte every 50 ms: a download long enough
    to be cancelled part-way."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(45 << 20))
        self.end_headers()
        try:
            for _ in range(45):
                self.wfile.write(b"\0" * (1 << 20))
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


def test_a_download_from_a_mirror_shows_progress_is_cancelled_cleanly_and_names_the_address_when_gone(torch_home):
    """`main.py fetch-weights` (what the Auto box's Download runs) through TRAINDECK_WEIGHTS_MIRROR, a local server
    sending torchvision's file name: progress lines as it goes; SIGTERM (the app's Cancel) part-way leaves nothing in
    the cache, not even a partial file; with the server gone, the refusal names the address it tried."""
    server = Server(("127.0.0.1", 0), SlowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mirror = f"http://127.0.0.1:{server.server_address[1]}"
    env = dict(os.environ, TRAINDECK_WEIGHTS_MIRROR=mirror, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "fetch-weights", "resnet18"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said, progress = [], []
        while len(progress) < 2:  # two progress lines: the download is going
            said.append(proc.stderr.readline())
            progress += [line for line in said[-1:] if line.startswith(f"{RESNET18_FILE}: ")]
            assert said[-1], said
        assert said[0].startswith(f"downloading {mirror}/{RESNET18_FILE}"), said
        assert all(line.strip().endswith("/47.2 MB") for line in progress), progress
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 130 and "cancelled: nothing of" in rest, rest
    assert not list((torch_home / "hub" / "checkpoints").iterdir()), "nothing kept, no partial file"

    gone = run_here("fetch-weights", "resnet18", env=env)
    assert gone.returncode == 2
    assert f"{mirror}/{RESNET18_FILE}" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr


@pytest.mark.slow
def test_gradual_unfreezing_trains_the_backbone_only_from_epoch_n(torch_home, no_network, shapes_dir, tmp_path):
    file_state = seed_resnet18(torch_home)
    cfg = pretrained_config(tmp_path, shapes_dir, unfreeze_at_epoch=1)
    run, code = train_here(cfg, tmp_path / "runs", ["train.epochs=2"])
    assert code == 0, run.tail_log()
    first = load_weights_only(next(run.checkpoints.glob("ckpt-e0001-*.pt")))["model"]
    second = load_weights_only(next(run.checkpoints.glob("ckpt-e0002-*.pt")))["model"]
    assert backbone_equal(first, file_state), "frozen through epoch 1, BatchNorm statistics too"
    assert not torch.equal(first["fc.weight"], second["fc.weight"])
    assert not torch.equal(second["layer1.0.conv1.weight"], file_state["layer1.0.conv1.weight"])
    assert not torch.equal(second["bn1.running_mean"], file_state["bn1.running_mean"])
    start = next(e for e in read_events(run.events) if e["event"] == "run_start")
    assert start["frozen"] == {"backbone": False, "until_epoch": 1}


@pytest.mark.slow
def test_a_resume_across_the_unfreeze_epoch_equals_an_uninterrupted_run(shapes_dir, tmp_path):
    """Stopped in the middle of epoch 1 (frozen) and resumed through the unfreezing at epoch 2 (0-based 1)."""
    import subprocess
    import sys
    import time

    from helpers import REPO, wait_for_event

    # the built-in CNN from scratch: the unfreezing logic is the same with or without pretrained weights, and fast
    cfg = write_config(tmp_path, shapes_dir, model={"name": "small_cnn", "unfreeze_at_epoch": 1},
                       scheduler={"name": "none"})
    sets = ["train.epochs=2", "data.batch_size=8", "checkpoint.every_steps=4", "monitor.log_every=1"]
    straight = tmp_path / "straight"
    assert run_here("train", cfg, "--run-dir", straight, "--set", *sets).returncode == 0
    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "train", str(cfg), "--run-dir", str(interrupted),
                             "--set", *sets], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_event(interrupted, lambda e: e["event"] == "checkpoint" and e["mid_epoch"] and e["epoch"] == 0)
    os.killpg(proc.pid, 15)
    proc.communicate(timeout=60)
    time.sleep(0.1)
    result = run_here("resume", interrupted)
    assert result.returncode == 0, result.stderr[-2000:]
    a = load_weights_only(straight / "checkpoints" / "last.pt")
    b = load_weights_only(interrupted / "checkpoints" / "last.pt")
    assert a["step"] == b["step"]
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


# ---- timm, where installed --------------------------------------------------------------------------------

timm = pytest.importorskip("timm", reason="timm is an optional extra (pip install -e '.[timm]')")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """timm's test_resnet weights in a temporary Hugging Face cache, as hf_hub_download keeps them."""
    import huggingface_hub.constants
    from safetensors.torch import save_file

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read the environment when it was imported (by timm, at collection): point it here too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    repo = home / "hub" / "models--timm--test_resnet.r160_in1k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    torch.manual_seed(5)
    state = {k: v.contiguous() for k, v in timm.create_model("test_resnet").state_dict().items()}
    save_file(state, str(repo / "snapshots" / commit / "model.safetensors"))
    return state


def test_timm_weights_from_the_hugging_face_cache_with_their_normalisation(hf_cache, no_network, shapes_dir, tmp_path):
    cfg = write_config(tmp_path, shapes_dir, model={"name": "timm:test_resnet", "weights": "DEFAULT",
                                                    "freeze_backbone": True}, data={"image_size": 32})
    run, code = train_here(cfg, tmp_path / "runs", ["train.epochs=1"])
    assert code == 0, run.tail_log()
    start = next(e for e in read_events(run.events) if e["event"] == "run_start")
    assert start["mean"] == [0.5, 0.5, 0.5] and start["std"] == [0.5, 0.5, 0.5]
    trained = load_weights_only(run.checkpoints / "last.pt")["model"]
    head = start["head"]
    assert trained[f"{head}.weight"].shape[0] == 4
    assert all(torch.equal(trained[k], v) for k, v in hf_cache.items() if not k.startswith(head + "."))


def test_a_timm_name_without_timm_gives_the_install_command(monkeypatch, shapes_dir, tmp_path, capsys):
    import builtins

    real_import = builtins.__import__

    def no_timm(name, *args, **kwargs):
        if name == "timm" or name.startswith("timm."):
            raise ImportError("No module named 'timm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_timm)
    cfg = write_config(tmp_path, shapes_dir, model={"name": "timm:resnet18", "weights": "DEFAULT"})
    code = cli.main(["train", str(cfg), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install -e '.[timm]'" in err and not (tmp_path / "runs").exists()


def test_describe_model_reports_head_weights_and_normalisation(capsys):
    assert cli.main(["describe-model", "resnet18", "--classes", "3", "--weights", "DEFAULT"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["head"] == "fc" and info["weights"] == ["DEFAULT", "IMAGENET1K_V1"]
    assert [p["name"] for p in info["parameters"] if p["head"]] == ["fc.weight", "fc.bias"]
    assert info["normalisation"]["mean"] == [0.485, 0.456, 0.406]
