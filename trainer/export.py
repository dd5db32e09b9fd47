"""Exporting a run's checkpoint in formats other tools load, and predicting with any of them.

Each export writes `<out>.json` beside it: model name, classes, image size, mean/std, source run and
checkpoint, so `predict` (or any other program) can preprocess images the same way training did.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from trainer.checkpoint import UnsafeFileError, load_weights_only
from trainer.config import ModelConfig
from trainer.data import decode_image
from trainer.models import create_model
from trainer.rundir import RunDir

log = logging.getLogger(__name__)

FORMATS = {"state_dict": ".pt", "safetensors": ".safetensors", "exported_program": ".pt2",
           "torchscript": ".ts.pt", "onnx": ".onnx"}
ONNX_OPSET = 18  # what the dynamo exporter targets well and onnxruntime >= 1.16 runs


class ExportError(ValueError):
    pass


def load_run_model(run: RunDir, which: str = "best") -> tuple[torch.nn.Module, dict, Path]:
    """The trained network of a run (eval mode) with its checkpoint's metadata."""
    path = run.checkpoints / f"{which}.pt"
    if not path.exists():
        raise ExportError(f"{path}: no such checkpoint (has the run finished an epoch?)")
    try:
        state = load_weights_only(path)
    except UnsafeFileError as e:
        raise ExportError(str(e)) from e
    model = create_model(ModelConfig(name=state["model_name"]), len(state["classes"]))
    model.load_state_dict(state["model"])
    return model.eval(), state, path


def export_run(run: RunDir, fmt: str, out: Path, which: str = "best") -> Path:
    if fmt not in FORMATS:
        raise ExportError(f"--format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    model, state, ckpt_path = load_run_model(run, which)
    pre = state["preprocess"]
    out.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, 3, pre["image_size"], pre["image_size"])
    if fmt == "state_dict":
        torch.save(model.state_dict(), out)
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    elif fmt == "exported_program":
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}} if _arg_name(model) == "x"
                                      else ({0: batch},))
        torch.export.save(program, out)
    elif fmt == "torchscript":
        torch.jit.save(torch.jit.trace(model, example), str(out))
    elif fmt == "onnx":
        torch.onnx.export(model, (example,), str(out), input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=ONNX_OPSET,
                          dynamo=False)
    sidecar = {"format": fmt, "model_name": state["model_name"], "classes": state["classes"],
               "image_size": pre["image_size"], "mean": pre["mean"], "std": pre["std"], "resize": pre["resize"],
               "source_run": str(run.path), "checkpoint": str(ckpt_path), "epoch": state["epoch"],
               "best_acc": state.get("best_acc")}
    Path(f"{out}.json").write_text(json.dumps(sidecar, indent=1))
    log.info("exported %s as %s to %s", ckpt_path, fmt, out)
    return out


def _arg_name(model: torch.nn.Module) -> str:
    import inspect

    return next(iter(inspect.signature(model.forward).parameters), "x")


def predict(export: Path, images: list[Path]) -> list[tuple[str, str, float]]:
    """(image, class, probability) for each image, using the export's sidecar preprocessing."""
    sidecar_path = Path(f"{export}.json")
    if not sidecar_path.exists():
        raise ExportError(f"{sidecar_path}: missing (written by `main.py export` beside the model)")
    meta = json.loads(sidecar_path.read_text())
    size = meta["image_size"]
    mean = torch.tensor(meta["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(meta["std"]).view(1, 3, 1, 1)
    try:
        batch = torch.stack([decode_image(str(p), size) for p in images]).float() / 255
    except OSError as e:
        raise ExportError(f"cannot read image: {e}") from e
    x = (batch - mean) / std
    fmt = meta["format"]
    with torch.no_grad():
        if fmt in ("state_dict", "safetensors"):
            model = create_model(ModelConfig(name=meta["model_name"]), len(meta["classes"])).eval()
            if fmt == "safetensors":
                from safetensors.torch import load_file

                model.load_state_dict(load_file(str(export)))
            else:
                model.load_state_dict(load_weights_only(export))
            logits = model(x)
        elif fmt == "exported_program":
            logits = torch.export.load(str(export)).module()(x)
        elif fmt == "torchscript":
            logits = torch.jit.load(str(export))(x)
        elif fmt == "onnx":
            import onnxruntime

            session = onnxruntime.InferenceSession(str(export), providers=["CPUExecutionProvider"])
            logits = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
        else:
            raise ExportError(f"{sidecar_path}: unknown format {fmt!r}")
    probs = torch.softmax(logits.float(), dim=1)
    conf, idx = probs.max(1)
    return [(str(p), meta["classes"][i], c) for p, i, c in zip(images, idx.tolist(), conf.tolist())]
