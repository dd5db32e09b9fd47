"""A model file never names code that runs (issue #67): a checkpoint, an export's card or sidecar, or a run folder's
config.yaml that names a `.py` file is refused in one line, through every command and the app's resident worker, and
the file never runs. Your own module runs when you trusted it at the call (`--model-code`, the app's Own model file…),
and only with the bytes you trusted."""

import json
import shutil

import pytest
import torch
import yaml
from helpers import run_here, train_here, trusted_model, write_config

from trainer.core.catalog import EXPORT_FORMATS

MARKING_MODEL = """
import pathlib
import torch

pathlib.Path({marker!r}).write_text("this code ran")


class Net(torch.nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))
"""
PLANTED_FORMATS = ("state_dict", "safetensors", "onnx", "exported_program", "torchscript", "onnx_fp16")
# (the other formats' loaders are these loaders, or read a graph that holds the network: see the test below)


@pytest.fixture(scope="module")
def planted(tmp_path_factory, shapes_dir):
    """A run and its exports whose every model name is `evil/net.py:Net`, a file that writes a marker when it runs
    (never trusted); (run folder, {format: export}, the image, the marker, the spec)."""
    tmp = tmp_path_factory.mktemp("named-code")
    run, code = train_here(write_config(tmp, shapes_dir, train={"epochs": 1}), tmp / "runs")
    assert code == 0
    exports = {}
    for fmt in PLANTED_FORMATS:
        out = tmp / "exports" / fmt / "model"
        out.parent.mkdir(parents=True)
        result = run_here("export", run.path, "--format", fmt, "--out", f"{out}{EXPORT_FORMATS[fmt]}")
        assert result.returncode == 0, result.stderr
        exports[fmt] = next(p for p in out.parent.iterdir() if not p.name.endswith((".json", ".md")))
    marker = tmp / "MARKER"
    (tmp / "evil").mkdir()
    (tmp / "evil" / "net.py").write_text(MARKING_MODEL.format(marker=str(marker)))
    spec = f"{tmp / 'evil' / 'net.py'}:Net"
    for checkpoint in (run.path / "checkpoints").glob("*.pt"):
        if checkpoint.is_symlink():
            continue
        state = torch.load(checkpoint, weights_only=True)
        state["model_name"] = spec
        torch.save(state, checkpoint)
    config = yaml.safe_load(run.config.read_text())
    config["model"]["name"] = spec
    run.config.write_text(yaml.safe_dump(config))
    for export in exports.values():
        card = export.with_name(export.name + ".json")
        meta = json.loads(card.read_text())
        meta["model_name"] = spec
        card.write_text(json.dumps(meta))
    image = next(shapes_dir.rglob("*.png"))
    return run.path, exports, image, marker, spec


def _refused(result, spec: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"{spec} is code, and TrainDeck runs no code that a file names" in result.stderr
    assert "--model-code" in result.stderr, "it says how to trust it"
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("command", ["predict", "evaluate", "grad-cam", "resume", "export"])
def test_a_run_folder_that_names_code_is_refused_and_runs_nothing(planted, tmp_path, command):
    run, _, image, marker, spec = planted
    copy = shutil.copytree(run, tmp_path / "run", symlinks=True)
    args = {"predict": ("predict", copy, image), "evaluate": ("evaluate", copy, "--data", image.parent.parent),
            "grad-cam": ("grad-cam", copy, image, "--out", tmp_path / "cam.png"),
            "resume": ("resume", copy, "--force"),
            "export": ("export", copy, "--format", "onnx", "--out", tmp_path / "m.onnx")}[command]
    _refused(run_here(*args), spec)
    assert not marker.exists(), f"{command} ran the code the run folder names"


@pytest.mark.parametrize("fmt", PLANTED_FORMATS)
def test_an_export_whose_card_names_code_runs_nothing(planted, fmt):
    _, exports, image, marker, spec = planted
    result = run_here("predict", exports[fmt], image)
    if fmt in ("state_dict", "safetensors"):  # the weights alone: the card's name would build the network
        _refused(result, spec)
    else:  # the graph is in the file: the card's name is only a label
        assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"predict on a {fmt} export ran the code its card names"


def test_only_the_weights_formats_build_a_network_from_a_card_s_name():
    """Every export format's loader: only those of the weights alone (state_dict, safetensors) build a network, and
    they build it through `create_model`, whose own model code is gated (trainer/core/user_code.py); the others read
    a graph that holds the network (ONNX, torch.export, TorchScript, ExecuTorch, Core ML, OpenVINO, LiteRT)."""
    import inspect

    from trainer.deploy import formats

    building = {fmt for fmt in EXPORT_FORMATS
                if any(name in inspect.getsource(formats.part(fmt, "load")) for name in ("_network", "create_model"))}
    assert building == {"state_dict", "safetensors"}, building


def test_the_resident_worker_answers_the_app_s_questions_without_running_named_code(planted, qtbot):
    from PySide6.QtCore import QObject

    from app.jobs.background import CliJob

    run, exports, image, marker, spec = planted
    from trainer.runs.commands import DescribeModel, GradCam, Predict

    for request in (Predict(model=str(run), images=[str(image)], json=True),
                    Predict(model=str(exports["safetensors"]), images=[str(image)], json=True),
                    GradCam(run_dir=str(run), image=str(image), out=str(image.parent.parent.parent / "cam.png")),
                    DescribeModel(name=spec)):
        owner, got = QObject(), {}
        job = CliJob(request, owner)  # what Try it, Grad-CAM and the Model page ask
        job.done.connect(lambda answer, got=got: got.setdefault("answer", answer))
        job.failed.connect(lambda error, got=got: got.setdefault("error", error))
        qtbot.waitUntil(lambda got=got: bool(got), timeout=120_000)
        assert "is code, and TrainDeck runs no code that a file names" in got.get("error", ""), (request, got)
    assert not marker.exists()


def test_trusted_at_the_call_your_own_module_builds_and_a_changed_file_is_refused(planted, tmp_path):
    run, _, image, marker, spec = planted
    copy = shutil.copytree(run, tmp_path / "run", symlinks=True)
    mine = tmp_path / "mine.py"
    mine.write_text(MARKING_MODEL.format(marker=str(tmp_path / "mine-ran")))
    result = run_here("describe-model", f"{mine}:Net", "--classes", "4", "--model-code", f"{mine}:Net")
    assert result.returncode == 0 and (tmp_path / "mine-ran").exists(), "trusted at the call, it builds"
    assert run_here("describe-model", f"{mine}:Net", "--classes", "4").returncode == 0, "and stays trusted"
    mine.write_text(mine.read_text() + "\n# changed\n")
    changed = run_here("describe-model", f"{mine}:Net", "--classes", "4")
    assert changed.returncode == 2 and f"{mine} changed since you trusted it" in changed.stderr
    assert not marker.exists(), "trusting one file trusts no other"
    run_here("predict", copy, image, "--model-code", spec)  # the user chose to trust the run's code: it runs
    assert marker.exists()
    marker.unlink()


def test_a_user_model_trains_when_trusted_at_the_call(shapes_dir, tmp_path):
    """Training with one's own module stays one flag away, and its DDP-free run builds from the trusted bytes."""
    name = trusted_model(tmp_path / "net.py", MARKING_MODEL.format(marker=str(tmp_path / "ran")))
    run, code = train_here(write_config(tmp_path, shapes_dir, model={"name": name}, train={"epochs": 1}),
                           tmp_path / "runs")
    assert code == 0 and (tmp_path / "ran").exists()


@pytest.mark.parametrize("change, said", [
    ({"image_size": 5000}, "image_size 5000 is outside what a model takes (8 to 1024 px)"),
    ({"image_size": 30000, "image_width": 30000}, "image_size 30000 is outside"),
    ({"classes": ["a", "b", "c"]}, "names 3 classes"),
    ({"classes": "abcd"}, "classes must be a list of 1 to 100,000 names"),
    ({"thresholds": [0.5]}, "1 thresholds for 4 labels"),
    ({"image_size": 24, "image_width": 24}, "does not take the 24x24 images"),
])
def test_a_card_that_disagrees_with_its_model_is_one_line_before_any_image(planted, tmp_path, change, said):
    """Issue #67: a card's sizes and classes are checked against the model (one image of zeros) before the user's
    images are: no 3 GB allocation for image_size 5000, no IndexError for a class too few."""
    _, exports, image, _, _ = planted
    onnx = shutil.copy(exports["onnx"], tmp_path / "model.onnx")
    card = json.loads(exports["onnx"].with_name(exports["onnx"].name + ".json").read_text())
    (tmp_path / "model.onnx.json").write_text(json.dumps({**card, **change}))
    result = run_here("predict", onnx, image)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "TrainDeck bug" not in result.stderr


def test_weights_that_give_non_finite_outputs_are_named(planted, tmp_path):
    from safetensors.torch import load_file, save_file

    _, exports, image, _, _ = planted
    weights = load_file(str(exports["safetensors"]))
    save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in weights.items()},
              str(tmp_path / "model.safetensors"))
    card = json.loads(exports["safetensors"].with_name(exports["safetensors"].name + ".json").read_text())
    (tmp_path / "model.safetensors.json").write_text(json.dumps({**card, "model_name": "small_cnn"}))
    result = run_here("predict", tmp_path / "model.safetensors", image)
    assert result.returncode == 2 and "gives non-finite outputs (nan or inf)" in result.stderr, result.stderr


def test_weights_of_one_wrong_shape_name_the_tensor(planted, tmp_path):
    from safetensors.torch import load_file, save_file

    _, exports, image, _, _ = planted
    weights = load_file(str(exports["safetensors"]))
    name = next(k for k, v in weights.items() if v.dim() == 2)  # the classifier's weight
    weights[name] = torch.zeros(weights[name].shape[0], weights[name].shape[1] + 1)
    save_file(weights, str(tmp_path / "model.safetensors"))
    card = json.loads(exports["safetensors"].with_name(exports["safetensors"].name + ".json").read_text())
    (tmp_path / "model.safetensors.json").write_text(json.dumps({**card, "model_name": "small_cnn"}))
    result = run_here("predict", tmp_path / "model.safetensors", image)
    assert result.returncode == 2 and f"shape mismatch {name}" in result.stderr, result.stderr
    assert "damaged or truncated" not in result.stderr


def test_an_openvino_graph_of_a_gibibyte_is_refused_before_openvino_reads_it(planted, tmp_path):
    """Issue #67: a model.xml with a 1 GiB comment took `predict` to 1.6 GB. The graph (weights apart) is bounded."""
    _, exports, image, _, _ = planted
    folder = tmp_path / "model.openvino"
    folder.mkdir()
    with open(folder / "model.xml", "wb") as f:  # sparse: a gibibyte that takes no disk
        f.write(b'<?xml version="1.0"?>\n<net name="x" version="11"><!--')
        f.seek(1 << 30)
        f.write(b"--></net>\n")
    (folder / "model.bin").write_bytes(b"\0" * 64)
    card = json.loads(exports["onnx"].with_name(exports["onnx"].name + ".json").read_text())
    (tmp_path / "model.openvino.json").write_text(json.dumps({**card, "format": "openvino"}))
    result = run_here("predict", folder, image)
    assert result.returncode == 2 and "more than a OpenVINO graph may be" in result.stderr.replace("an OpenVINO",
                                                                                                   "a OpenVINO")
    assert "64 MiB" in result.stderr and "Traceback" not in result.stderr
