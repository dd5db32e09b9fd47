"""Exporting a run's checkpoint in formats other tools load, and predicting with any of them.

Each export writes `<out>.json` beside it: model name, classes, image size, mean/std, source run and
checkpoint, so `predict` (or any other program) can preprocess images the same way training did.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.catalog import EXPORT_FORMATS
from trainer.checkpoint import UnsafeFileError, load_weights_only, read_checkpoint
from trainer.config import ModelConfig
from trainer.data import decode_image
from trainer.models import create_model
from trainer.rundir import RunDir

log = logging.getLogger(__name__)

ONNX_OPSET = 18  # what the dynamo exporter targets well and onnxruntime >= 1.16 runs


class ExportError(ValueError):
    pass


def load_run_model(run: RunDir, which: str = "best") -> tuple[torch.nn.Module, dict, Path]:
    """The trained network of a run (eval mode) with its checkpoint's metadata."""
    path = run.checkpoints / f"{which}.pt"
    if not path.exists():
        raise ExportError(f"{path}: no such checkpoint (has the run finished an epoch?)")
    try:
        state = read_checkpoint(path)
    except (UnsafeFileError, ValueError) as e:
        raise ExportError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - a damaged file, in whatever way torch reports it
        raise ExportError(f"{path}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
    model = create_model(ModelConfig(name=state["model_name"]), len(state["classes"]))
    model.load_state_dict(state["model"])
    return model.eval(), state, path


def export_run(run: RunDir, fmt: str, out: Path, which: str = "best") -> Path:
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"--format: unknown format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    if out.is_dir():
        raise ExportError(f"--out: {out} is a folder; give a file name, such as {out / ('model' + EXPORT_FORMATS[fmt])}")
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


@dataclass
class Prediction:
    """One image's result: the top classes with their probabilities (best first), or why it could not be read."""
    path: str
    top: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        return self.top[0][0]

    @property
    def probability(self) -> float:
        return self.top[0][1]


def expand_images(paths: list[Path]) -> list[Path]:
    """The images to classify: files as given; folders replaced by the image files under them (sorted)."""
    from trainer.scan import IMAGE_EXTENSIONS

    out = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
        else:
            out.append(p)
    return out


def load_predictor(source: Path, which: str = "best") -> tuple[Callable[[torch.Tensor], torch.Tensor], dict]:
    """A callable images -> logits and its preprocessing {classes, image_size, mean, std}, from a run directory
    (its `which` checkpoint) or an exported model with its `.json` sidecar."""
    if source.is_dir():
        model, state, _ = load_run_model(RunDir(source), which)
        return model, {"classes": state["classes"], **state["preprocess"]}
    sidecar_path = Path(f"{source}.json")
    if not source.is_file():
        raise ExportError(f"{source}: no such model file or run directory")
    if not sidecar_path.exists():
        raise ExportError(f"{sidecar_path}: missing (written by `main.py export` beside the model)")
    try:
        meta = json.loads(sidecar_path.read_text(encoding="utf-8"))
        meta["image_size"], meta["format"], meta["classes"], meta["mean"], meta["std"]  # noqa: B018 - all present
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{sidecar_path}: not a TrainDeck export description ({type(e).__name__}: {e})") from e
    fmt = meta["format"]
    try:
        return _load_export(source, fmt, meta), meta
    except (ExportError, UnsafeFileError) as e:
        raise ExportError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - truncated or damaged files fail deep inside each loader
        raise ExportError(f"{source}: cannot load the {fmt} model, the file looks damaged or truncated "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from e


def predict(source: Path, images: list[Path], top: int = 1, which: str = "best", batch: int = 64) -> list[Prediction]:
    """Classify images (files, or folders of them) with a run's checkpoint or an exported model, preprocessed as in
    training. An image that cannot be read gets an `error` naming it; the others are still classified."""
    net, meta = load_predictor(source, which)
    classes = meta["classes"]
    mean = torch.tensor(meta["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(meta["std"]).view(1, 3, 1, 1)
    results = [Prediction(str(p)) for p in expand_images(images)]
    for start in range(0, len(results), batch):
        chunk, decoded = results[start:start + batch], []
        for r in chunk:
            try:
                decoded.append(decode_image(r.path, meta["image_size"]))
            except Exception as e:  # noqa: BLE001 - unreadable, truncated, not an image, a bomb: name the file
                r.error = f"{r.path}: cannot read image ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        readable = [r for r in chunk if r.error is None]
        if not readable:
            continue
        x = (torch.stack(decoded).float() / 255 - mean) / std
        with torch.no_grad():
            probs = torch.softmax(net(x).float(), dim=1)
        values, indices = probs.topk(min(top, len(classes)), dim=1)
        for r, v, i in zip(readable, values.tolist(), indices.tolist()):
            r.top = [(classes[j], p) for j, p in zip(i, v)]
    return results


def _load_export(export: Path, fmt: str, meta: dict):
    """A callable images -> logits for an exported model of any format."""
    if fmt in ("state_dict", "safetensors"):
        model = create_model(ModelConfig(name=meta["model_name"]), len(meta["classes"])).eval()
        if fmt == "safetensors":
            from safetensors.torch import load_file

            model.load_state_dict(load_file(str(export)))
        else:
            model.load_state_dict(load_weights_only(export))
        return model
    if fmt == "exported_program":
        quiet = logging.getLogger("torch.export")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # it logs its own traceback for a damaged file before raising
        try:
            return torch.export.load(str(export)).module()
        finally:
            quiet.setLevel(level)
    if fmt == "torchscript":
        return torch.jit.load(str(export))
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(export), providers=["CPUExecutionProvider"])
        return lambda x: torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    raise ExportError(f"{export}.json: unknown format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
