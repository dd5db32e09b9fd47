"""Exporting a run's checkpoint in formats other tools load, and predicting with any of them.

Each export writes `<out>.json` beside it: model name, classes, image size, mean/std, source run and
checkpoint, so `predict` (or any other program) can preprocess images the same way training did.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.catalog import EXPORT_FORMATS
from trainer.errors import InputError, first_line
from trainer.files import atomic_write_text
from trainer.inference import FlipAveraged, classify, load_model, load_run_model
from trainer.rundir import RunDir

log = logging.getLogger(__name__)

GRAPH_FORMATS = ("onnx", "exported_program", "torchscript")  # what carries its computation (eval.tta too)
ONNX_OPSET = 18  # what the dynamo exporter targets well and onnxruntime >= 1.16 runs


class ExportError(InputError, ValueError):
    pass


def export_run(run: RunDir, fmt: str, out: Path, which: str = "best") -> Path:
    """Export a run's checkpoint as `fmt` to `out`, with its `.json` sidecar. The file is written beside `out`
    under a temporary name and renamed into place, so a failure leaves nothing half-written."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"--format: unknown format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    if out.is_dir():
        raise ExportError(f"--out: {out} is a folder; give a file name, such as {out / ('model' + EXPORT_FORMATS[fmt])}")
    loaded = load_run_model(run, which)
    check_writable(out.parent)
    model, state, ckpt_path = loaded.net.to(memory_format=torch.contiguous_format), loaded.state, loaded.source
    pre = state["preprocess"]
    in_graph = fmt in GRAPH_FORMATS
    if pre.get("tta") and in_graph:
        model = FlipAveraged(model).eval()
    tmp = out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")  # the suffix kept: some writers look at it
    try:
        _write(model, fmt, tmp, torch.zeros(2, 3, pre["image_size"], pre["image_size"]))
        sidecar = {"format": fmt, "model_name": state["model_name"], "classes": state["classes"],
                   "image_size": pre["image_size"], "mean": pre["mean"], "std": pre["std"], "resize": pre["resize"],
                   "source_run": str(run.path), "checkpoint": str(ckpt_path), "epoch": state["epoch"],
                   "best_acc": state.get("best_acc")}
        if pre.get("tta"):  # eval.tta: in the graph, or the caller averages the mirror image's logits
            sidecar["tta"] = "graph" if in_graph else "caller"
        os.replace(tmp, out)
        atomic_write_text(Path(f"{out}.json"), json.dumps(sidecar, indent=1))
    except OSError as e:
        raise ExportError(f"--out: {out}: cannot be written ({e.strerror or first_line(e)})") from e
    finally:
        tmp.unlink(missing_ok=True)
    log.info("exported %s as %s to %s", ckpt_path, fmt, out)
    return out


def check_writable(folder: Path) -> None:
    """The folder exists (made if need be) and this process can create files in it; ExportError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".traindeck-write-check-")
        probe.close()
    except OSError as e:
        raise ExportError(f"--out: {folder}: cannot write there ({e.strerror or first_line(e)})") from e


def _write(model: torch.nn.Module, fmt: str, path: Path, example: torch.Tensor) -> None:
    if fmt == "state_dict":
        torch.save(model.state_dict(), path)
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    elif fmt == "exported_program":
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}} if _arg_name(model) == "x"
                                      else ({0: batch},))
        torch.export.save(program, path)
    elif fmt == "torchscript":  # deprecated (catalog.DEPRECATED_EXPORT_FORMATS): torch warns on each call
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
            torch.jit.save(torch.jit.trace(model, example), str(path))
    elif fmt == "onnx":
        torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=ONNX_OPSET,
                          dynamo=False)


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


def predict(source: Path, images: list[Path], top: int = 1, which: str = "best") -> list[Prediction]:
    """Classify images (files, or folders of them) with a run's checkpoint or an exported model, preprocessed as in
    training. An image that cannot be read gets an `error` naming it; the others are still classified."""
    model = load_model(source, which)
    results = [Prediction(str(p)) for p in expand_images(images)]
    found = classify(model, [r.path for r in results])
    for i, reason in found.errors.items():
        results[i].error = f"{results[i].path}: {reason}"
    values, indices = found.logits.softmax(1).topk(min(top, len(model.classes)), dim=1)
    for i, v, c in zip(found.kept, values.tolist(), indices.tolist()):
        results[i].top = [(model.classes[j], p) for j, p in zip(c, v)]
    return results
