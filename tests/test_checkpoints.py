"""Checkpoints that survive kills and full disks, safe loading, and exports other tools load."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from helpers import REPO, run_card_snippet, run_here, train_here, write_config

from trainer import cli
from trainer.core.catalog import EXPORT_FORMATS as FORMATS
from trainer.data.frame import Frame
from trainer.data.loader import decode_image
from trainer.deploy.export import export_run, predict
from trainer.deploy.inference import load_run_model
from trainer.model import checkpoint as ckpt
from trainer.model.checkpoint import CorruptCheckpointError, UnsafeFileError, load_latest, load_weights_only
from trainer.model.models import ModelError
from trainer.model.weights import read_state_dict

shutil_usage = namedtuple("usage", "total used free")


shutil_usage = namedtuple("usage", "total used free")


def fake_state(epoch: int, step: int, size: int = 50_000) -> dict:
    return {"model": {"w": torch.full((size,), float(step))}, "epoch": epoch, "step": step}


@pytest.mark.slow
def test_kill_9_during_a_save_loop_leaves_a_loadable_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    script = ("import sys, torch\nfrom pathlib import Path\nfrom trainer.model.checkpoint import save_checkpoint\n"
              "step = 0\nwhile True:\n    step += 1\n"
              "    save_checkpoint(Path(sys.argv[1]), {'model': {'w': torch.full((2_000_000,), float(step))},"
              " 'epoch': step, 'step': step}, is_best=step % 3 == 0, keep_last=2)\n"
              "    print(step, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    for _ in range(4):
        proc.stdout.readline()
    time.sleep(0.05)  # land somewhere inside a save
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state, path = load_latest(folder)
    assert state["model"]["w"][0].item() == state["step"] >= 4
    assert not list(folder.glob(".*")), "temporary files of the killed writer are cleaned up"
    assert len(ckpt.numbered_checkpoints(folder)) <= 3
    best = load_weights_only(folder / "best.pt")
    assert best["step"] % 3 == 0


@pytest.mark.parametrize("how", ["errno", "torch_enforce", "unexpected_pos"])
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch, how):
    """ENOSPC from the OS, or torch's own `[enforce fail at inline_container.cc]` on a disk with no room left:
    either way the user reads 'no space left on device in FOLDER', and the previous checkpoint stays."""
    folder = tmp_path / "checkpoints"
    ckpt.save_checkpoint(folder, fake_state(1, 10), is_best=True, keep_last=3)
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        real_save({"partial": torch.zeros(10)}, f)
        if how == "errno":
            raise OSError(errno.ENOSPC, "No space left on device")
        if how == "unexpected_pos":  # what a 6 MB tmpfs gave (the red team's words)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2496 vs 2388")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(torch, "save", disk_full)
    if how != "errno":
        monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: shutil_usage(total=1 << 30, used=1 << 30, free=0))
    with pytest.raises(OSError, match=f"no space left on device in {folder}"):
        ckpt.save_checkpoint(folder, fake_state(2, 20), is_best=True, keep_last=3)
    monkeypatch.undo()
    state, path = load_latest(folder)
    assert state["step"] == 10 and path.name == "last.pt"
    assert load_weights_only(folder / "best.pt")["step"] == 10
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "ckpt-e0001-s00000010.pt", "last.pt"]


def test_a_checkpoint_from_a_newer_traindeck_is_refused_by_name(tmp_path):
    folder = tmp_path / "checkpoints"
    state = {**fake_state(1, 10), "format": ckpt.FORMAT, "version": ckpt.VERSION + 1}
    ckpt.save_checkpoint(folder, state, is_best=True, keep_last=3)
    with pytest.raises(ckpt.CheckpointVersionError, match=rf"last.pt: written by a newer TrainDeck \(checkpoint "
                                                           rf"version {ckpt.VERSION + 1}"):
        load_latest(folder)


def test_a_corrupt_last_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    for epoch in (1, 2, 3):
        ckpt.save_checkpoint(folder, fake_state(epoch, epoch * 10), is_best=False, keep_last=3)
    newest = folder / "ckpt-e0003-s00000030.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated (last.pt is the same file)
    state, path = load_latest(folder)
    assert state["step"] == 20 and path.name == "ckpt-e0002-s00000020.pt"
    assert "cannot be loaded" in caplog.text and "last.pt" in caplog.text
    for p in ckpt.numbered_checkpoints(folder):
        p.write_bytes(b"garbage")
    with pytest.raises(CorruptCheckpointError, match="no checkpoint loads"):
        load_latest(folder)


class Payload:
    """Unpickling this runs code: it creates a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path, shapes_dir):
    marker = tmp_path / "pwned"
    evil = tmp_path / "weights.pt"
    torch.save({"model": {"fc.weight": torch.zeros(2)}, "x": Payload(str(marker)), "epoch": 1}, evil)
    with pytest.raises(UnsafeFileError, match="refused, it needs full unpickling"):
        load_weights_only(evil)
    with pytest.raises(ModelError, match="model.weights: .*refused"):
        read_state_dict(evil)
    # as a user-supplied weights file in a real run, and as a checkpoint found on resume
    cfg = write_config(tmp_path, shapes_dir, model={"weights": str(evil)})
    result = run_here("train", cfg, "--runs-dir", tmp_path / "runs")
    assert result.returncode == 2 and "refused" in result.stderr
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "last.pt").write_bytes(evil.read_bytes())
    with pytest.raises(CorruptCheckpointError, match="refused"):
        load_latest(folder)
    assert not marker.exists(), "the payload must not have run"


def test_weights_for_another_architecture_name_the_mismatching_keys(tmp_path, shapes_dir):
    from safetensors.torch import save_file

    from trainer.core.config import ModelConfig
    from trainer.model.models import create_model
    from trainer.model.weights import load_file_weights

    other = create_model(ModelConfig(name="resnet18"), 7).state_dict()
    save_file({k: v.contiguous() for k, v in other.items()}, str(tmp_path / "r18.safetensors"))
    with pytest.raises(ModelError, match=r"does not fit this model \(missing features\.0\.0\.weight"):
        load_file_weights(create_model(ModelConfig(name="small_cnn"), 4), tmp_path / "r18.safetensors", "fc")
    # same architecture, other class count: the head is re-initialised, the rest loads
    model = create_model(ModelConfig(name="resnet18"), 4)
    assert load_file_weights(model, tmp_path / "r18.safetensors", "fc") == ["fc.bias", "fc.weight"]
    assert torch.equal(model.conv1.weight, other["conv1.weight"])


LOSSLESS = [f for f in FORMATS if f not in ("onnx_int8", "onnx_fp16", "coreml", "executorch", "openvino_int8",
                                            "litert", "litert_int8")]
# int8 and fp16: their own tests (tests/test_deploy.py), as the mobile formats' (batch 1: LiteRT, ExecuTorch)


@pytest.fixture(scope="module")
def trained_resnet(tmp_path_factory, shapes_dir):
    tmp = tmp_path_factory.mktemp("resnet")
    cfg = write_config(tmp, shapes_dir, model={"name": "resnet18"}, data={"image_size": 32}, train={"epochs": 1})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("fmt", LOSSLESS)
def test_exports_load_with_their_cards_snippet_without_traindeck_and_give_the_same_logits(trained_resnet, tmp_path,
                                                                                           fmt, shapes_dir):
    out = export_run(trained_resnet, fmt, tmp_path / f"model{FORMATS[fmt]}")
    sidecar = json.loads(open(f"{out}.json").read())
    assert sidecar["classes"] == ["circle", "cross", "square", "triangle"] and sidecar["image_size"] == 32
    assert sidecar["model_name"] == "resnet18" and sidecar["source_run"] == str(trained_resnet.path)
    loaded = load_run_model(trained_resnet)
    model, state = loaded.net, loaded.state
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(run_card_snippet(out, x, tmp_path), expected, rtol=1e-4, atol=1e-4)

    images = sorted(shapes_dir.glob("*/*.png"))[::29]
    predicted = [r.label for r in predict(out, images)]
    mean = torch.tensor(state["preprocess"]["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(state["preprocess"]["std"]).view(1, 3, 1, 1)
    batch = (torch.stack([decode_image(str(p), Frame(32, 32)) for p in images]).float() / 255 - mean) / std
    with torch.no_grad():
        in_app = [state["classes"][i] for i in model(batch).argmax(1).tolist()]
    assert predicted == in_app
    assert sidecar["metrics"]["agreement"] == 1.0, "an fp32 format gives the checkpoint's class for every image"


def test_export_and_predict_from_the_command_line(trained_resnet, tmp_path, shapes_dir):
    out = tmp_path / "m.safetensors"
    result = run_here("export", trained_resnet.path, "--format", "safetensors", "--out", out, "--checkpoint", "last")
    assert result.returncode == 0, result.stderr
    image = next(shapes_dir.glob("circle/*.png"))
    result = run_here("predict", out, image)
    assert result.returncode == 0 and str(image) in result.stdout
    assert result.stdout.split("\t")[1] in ("circle", "cross", "square", "triangle")
    result = run_here("export", tmp_path / "nowhere", "--format", "onnx", "--out", tmp_path / "x.onnx")
    assert result.returncode == 2 and "no such checkpoint" in result.stderr and "Traceback" not in result.stderr


def test_checkpoints_are_written_in_the_background_from_a_snapshot(tmp_path, monkeypatch):
    """The save returns at once; until the new file is durable the previous checkpoint is the newest on disk; what
    is written is the state at the save point, even though training changes the tensors meanwhile."""
    import threading

    folder = tmp_path / "checkpoints"
    writer = ckpt.CheckpointWriter()
    ckpt.save_checkpoint(folder, fake_state(1, 10), is_best=True, keep_last=1, writer=writer)
    writer.wait()
    release, writing = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        writing.set()
        assert release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    live = fake_state(2, 20)
    weights = live["model"]["w"]
    ckpt.save_checkpoint(folder, live, is_best=False, keep_last=1, writer=writer)
    assert writing.wait(30)  # the writer is inside its write window, training goes on:
    weights.add_(1000)  # an optimizer step changes the live weights
    assert load_weights_only(folder / "last.pt")["step"] == 10  # (read, not load_latest: that clears temporaries)
    assert not (folder / "ckpt-e0002-s00000020.pt").exists()
    release.set()
    writer.wait()
    monkeypatch.undo()
    state, path = load_latest(folder)
    assert state["step"] == 20 and torch.equal(state["model"]["w"], weights - 1000)  # the snapshot, not the live
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "ckpt-e0002-s00000020.pt", "last.pt"]
    writer.close()


def test_a_writer_error_surfaces_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    writer = ckpt.CheckpointWriter()
    ckpt.save_checkpoint(folder, fake_state(1, 10), is_best=True, keep_last=1, writer=writer)
    writer.wait()

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    ckpt.save_checkpoint(folder, fake_state(2, 20), is_best=False, keep_last=1, writer=writer)
    with pytest.raises(OSError, match="Input/output error"):
        writer.wait()  # the trainer waits before its next save and before reporting the run finished
    monkeypatch.undo()
    assert load_latest(folder)[0]["step"] == 10
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "ckpt-e0001-s00000010.pt", "last.pt"]
    writer.close()


CRASH_IN_WRITE = """
import os, signal, sys, torch
sys.path.insert(0, sys.argv[2])
from trainer.model import checkpoint as ckpt
folder = __import__("pathlib").Path(sys.argv[1])
def state(epoch, step):
    return {"format": ckpt.FORMAT, "version": ckpt.VERSION, "epoch": epoch, "step": step, "batch_in_epoch": 0,
            "model": {"w": torch.full((256, 256), float(step))}}
writer = ckpt.CheckpointWriter()
ckpt.save_checkpoint(folder, state(1, 10), is_best=True, keep_last=3, writer=writer)
writer.wait()
real_save = torch.save
def dies_while_writing(obj, f, *a, **k):
    f.write(b"half a checkpoint")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # power cut, OOM killer: no cleanup at all
torch.save = dies_while_writing
ckpt.save_checkpoint(folder, state(2, 20), is_best=True, keep_last=3, writer=writer)
writer.wait()
"""


@pytest.mark.slow
def test_a_hard_crash_inside_the_write_window_loses_that_checkpoint_alone(tmp_path):
    folder = tmp_path / "checkpoints"
    result = subprocess.run([sys.executable, "-c", CRASH_IN_WRITE, str(folder), str(REPO)], capture_output=True,
                            timeout=120)
    assert result.returncode == -9
    assert any(p.name.endswith(".tmp") for p in folder.iterdir())  # the half-written temporary is there
    assert load_weights_only(folder / "best.pt")["step"] == 10
    state, path = load_latest(folder)  # what resume does: the previous one, whole, and the debris cleared
    assert state["step"] == 10 and path.name == "last.pt"
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())


@pytest.fixture(scope="module")
def small_exports(tmp_path_factory, shapes_dir):
    tmp = tmp_path_factory.mktemp("small")
    cfg = write_config(tmp, shapes_dir, train={"epochs": 1})
    run, code = train_here(cfg, tmp / "runs")
    assert code == 0
    return run, {fmt: export_run(run, fmt, tmp / "exports" / f"model{FORMATS[fmt]}") for fmt in LOSSLESS}


class NotATensor:
    pass


@pytest.mark.slow
def test_predict_names_damaged_models_and_images(small_exports, shapes_dir, tmp_path, capsys):
    import shutil

    from faults.test_data_faults import png_header_only

    from trainer import cli

    run, exports = small_exports
    image = next(shapes_dir.glob("circle/*.png"))

    def predict(model, *images) -> tuple[int, str]:
        code = cli.main(["predict", str(model), *map(str, images or [image])])
        return code, capsys.readouterr().err

    for fmt, path in exports.items():
        damaged = tmp_path / path.name
        if path.is_dir():  # an export that is a folder (OpenVINO): its weights file cut in half
            shutil.copytree(path, damaged)
            weights = max(damaged.iterdir(), key=lambda f: f.stat().st_size)
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        else:
            damaged.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        shutil.copy(f"{path}.json", f"{damaged}.json")
        code, err = predict(damaged)
        assert code == 2 and str(damaged) in err and "damaged or truncated" in err, (fmt, err)
        assert "Traceback" not in err
    pickled = tmp_path / "evil.pt"
    torch.save({"w": NotATensor()}, pickled)
    shutil.copy(f"{exports['state_dict']}.json", f"{pickled}.json")
    code, err = predict(pickled)
    assert code == 2 and "refused, it needs full unpickling" in err and "Traceback" not in err
    bomb = tmp_path / "bomb.png"
    png_header_only(bomb, 30000, 30000)
    code, err = predict(exports["onnx"], bomb)
    assert code == 2 and f"{bomb}: cannot read image" in err and "Traceback" not in err
    code = cli.main(["export", str(run.path), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"--out: {tmp_path} is a folder" in err and "exported_program.pt2" not in err
    assert f"such as {tmp_path / 'model.pt2'}" in err, "the default format is torch.export's"


def replace_member(archive: Path, out: Path, suffix: str, data: bytes) -> None:
    """A copy of a zip archive whose member ending in `suffix` holds `data`."""
    import zipfile

    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, data if info.filename.endswith(suffix) else src.read(info))


def test_an_exported_program_carrying_a_pickle_runs_nothing_whatever_its_name_or_sidecar(small_exports, shapes_dir,
                                                                                         tmp_path, capsys):
    """torch.export.load retries a member the safe loader refuses with full unpickling (torch 2.14): a crafted .pt2
    is refused before torch sees it, as .pt2, renamed .onnx with a sidecar saying either format, and with --json."""
    import json
    import pickle
    import shutil

    from trainer import cli

    _, exports = small_exports
    program = exports["exported_program"]
    image = next(shapes_dir.glob("circle/*.png"))
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(str(marker)))
    evil = tmp_path / "evil.pt2"
    replace_member(program, evil, "sample_inputs/model.pt", payload)
    shutil.copy(f"{program}.json", f"{evil}.json")
    nested = tmp_path / "nested.pt2"  # the member as torch.save writes it, a zip whose data.pkl is the payload
    torch.save({"x": Payload(str(marker))}, tmp_path / "member.pt")
    replace_member(program, nested, "sample_inputs/model.pt", (tmp_path / "member.pt").read_bytes())
    shutil.copy(f"{program}.json", f"{nested}.json")
    renamed = tmp_path / "x.onnx"
    shutil.copy(evil, renamed)
    sidecar = json.loads(Path(f"{program}.json").read_text())
    cases = [(evil, "sample_inputs/model.pt is not plain tensors"), (nested, "sample_inputs/model.pt is not plain"),
             (renamed, "is a torch.export program (.pt2), but x.onnx.json says onnx")]
    Path(f"{renamed}.json").write_text(json.dumps({**sidecar, "format": "onnx"}))
    for model, why in cases:
        for extra in ([], ["--json"]):
            code = cli.main(["predict", str(model), str(image), *extra])
            err = capsys.readouterr().err
            assert code == 2 and str(model) in err and why in err, (model, err)
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
            assert not marker.exists(), f"{model}: the payload ran"
    Path(f"{renamed}.json").write_text(json.dumps(sidecar))  # the sidecar now says exported_program: still refused
    assert cli.main(["predict", str(renamed), str(image)]) == 2 and "not plain tensors" in capsys.readouterr().err
    assert not marker.exists()
    assert cli.main(["predict", str(program), str(image)]) == 0, "the export as written still loads"


def test_a_torchscript_file_whose_pickle_names_other_code_is_refused(small_exports, shapes_dir, tmp_path, capsys):
    """TorchScript's pickles may name only its own classes and tensors: a data.pkl carrying a payload is refused
    before torch.jit.load reads it, and the marker the payload would write never appears."""
    import pickle
    import shutil

    from trainer import cli

    _, exports = small_exports
    script = exports["torchscript"]
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ts.pt"
    replace_member(script, evil, "/data.pkl", pickle.dumps(Payload(str(marker)), protocol=2))
    shutil.copy(f"{script}.json", f"{evil}.json")
    code = cli.main(["predict", str(evil), str(next(shapes_dir.glob("circle/*.png")))])
    err = capsys.readouterr().err
    assert code == 2 and "data.pkl names io open" in err and len(err.strip().splitlines()) == 1, err
    assert not marker.exists()
    assert cli.main(["predict", str(script), str(next(shapes_dir.glob("circle/*.png")))]) == 0


@pytest.mark.slow
def test_the_default_export_is_torch_export_and_torchscript_says_it_is_deprecated(trained_resnet, tmp_path, capsys,
                                                                                  shapes_dir):
    assert cli.main(["export", str(trained_resnet.path), "--out", str(tmp_path / "model.pt2")]) == 0
    assert json.loads((tmp_path / "model.pt2.json").read_text())["format"] == "exported_program"
    capsys.readouterr()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # torch's own deprecation warnings do not reach the user
        assert cli.main(["export", str(trained_resnet.path), "--format", "torchscript", "--out",
                         str(tmp_path / "m.ts.pt")]) == 0
        (result,) = predict(tmp_path / "m.ts.pt", sorted(shapes_dir.glob("circle/*.png"))[:1])
        assert result.error is None and result.label in ("circle", "cross", "square", "triangle")
    err = capsys.readouterr().err
    assert "note: TorchScript (torch.jit) is deprecated since torch 2.14" in err


def test_checkpoints_go_to_the_background_writer_only_where_training_leaves_the_cpu_room(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert not ckpt.writes_in_background("auto", cpu), "every core computes: a writer thread would stall them"
    assert ckpt.writes_in_background("auto", gpu), "a GPU run leaves the CPU to the writer"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert ckpt.writes_in_background("auto", cpu)
    assert not ckpt.writes_in_background("auto", cpu, local_processes=2), "two DDP ranks of 3 threads on 4 cores"
    assert ckpt.writes_in_background("background", cpu) and not ckpt.writes_in_background("sync", gpu)


def test_an_export_onto_a_read_only_folder_is_bad_input_and_leaves_nothing(trained_resnet, tmp_path, capsys):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere a mode forbids; sysfs refuses new files even to root
        read_only = Path("/sys/fs")
    before = sorted(read_only.iterdir())
    try:
        assert cli.main(["export", str(trained_resnet.path), "--out", str(read_only / "model.pt2")]) == 2
    finally:
        (tmp_path / "read-only").chmod(0o755)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --out: {read_only}: cannot write there (") and "\n" not in err, err
    assert sorted(read_only.iterdir()) == before, "nothing half-written"


def test_any_output_the_user_names_that_cannot_be_written_is_bad_input(trained_resnet, shapes_dir, tmp_path, capsys):
    """grad-cam --out, slurm --out, check-data --json into a folder that cannot be written: exit 2, one line naming
    it, as export does (the README's exit codes)."""
    read_only = Path("/sys/fs") if os.geteuid() == 0 else tmp_path / "ro"
    if os.geteuid() != 0:
        read_only.mkdir()
        read_only.chmod(0o555)
    image = next(shapes_dir.glob("circle/*.png"))
    cfg = write_config(tmp_path, shapes_dir)
    commands = [["grad-cam", str(trained_resnet.path), str(image), "--out", str(read_only / "cam.png")],
                ["slurm", str(cfg), "--out", str(read_only / "job.sh")],
                ["check-data", str(shapes_dir), "--json", str(read_only / "report.json")]]
    for argv in commands:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot write there" in err[0] and str(read_only) in err[0], (argv, err)


def test_random_bytes_are_said_to_be_no_checkpoint_not_a_pickle(tmp_path):
    junk = tmp_path / "last.pt"
    junk.write_bytes(bytes(range(7, 200)))
    with pytest.raises(UnsafeFileError, match="not a checkpoint"):
        load_weights_only(junk)
