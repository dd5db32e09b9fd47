"""Mobile formats through their makers' converters: ExecuTorch `.pte` (XNNPACK) and Core ML `.mlpackage`.

Both take one image at a time (batch 1), as apps call them. ExecuTorch programs run here through its Python runtime,
so they are measured like any export; Core ML models run only on Apple's systems: here they are loaded back and
their inputs and outputs checked, not run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

INPUT, OUTPUT = "images", "logits"  # the names every TrainDeck export gives its input and output


@contextlib.contextmanager
def _quiet_converter_logs():
    """The converters import torchao, whose start-up warns through torch's logging about its own internals."""
    names = ("torch.utils._pytree", "coremltools", "torch._export")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def write_executorch(model: torch.nn.Module, path: Path, image_size: int) -> None:
    with _quiet_converter_logs():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        program = torch.export.export(model, (torch.zeros(1, 3, image_size, image_size),))
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(lowered.buffer)


def load_executorch(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """An ExecuTorch program as images -> logits; a batch is run one image at a time (the program takes one)."""
    with _quiet_converter_logs():
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(str(path)).load_method("forward")
    return lambda x: torch.cat([method.execute([x[i:i + 1].contiguous()])[0] for i in range(len(x))])


def write_coreml(model: torch.nn.Module, path: Path, image_size: int, classes: list[str]) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")  # coremltools' progress bars: a screenful on stderr per export
    with _quiet_converter_logs():
        import coremltools as ct

        program = torch.export.export(model, (torch.zeros(1, 3, image_size, image_size),)).run_decompositions({})
        converted = ct.convert(program, inputs=[ct.TensorType(name=INPUT, shape=(1, 3, image_size, image_size))],
                               outputs=[ct.TensorType(name=OUTPUT)], convert_to="mlprogram",
                               minimum_deployment_target=ct.target.iOS16)
    converted.user_defined_metadata["classes"] = ",".join(classes)
    converted.short_description = f"TrainDeck image classifier ({len(classes)} classes)"
    converted.save(str(path))


def check_coreml(path: Path, image_size: int, n_classes: int) -> None:
    """Load a Core ML package back and check its input and output; ValueError naming what differs."""
    with _quiet_converter_logs():
        import coremltools as ct

        spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    (given,), (produced,) = spec.description.input, spec.description.output
    shape = list(given.type.multiArrayType.shape)
    if given.name != INPUT or shape != [1, 3, image_size, image_size]:
        raise ValueError(f"{path}: input {given.name} {shape}, expected {INPUT} [1, 3, {image_size}, {image_size}]")
    out_shape = list(produced.type.multiArrayType.shape)
    if produced.name != OUTPUT or (out_shape and out_shape[-1] != n_classes):
        raise ValueError(f"{path}: output {produced.name} {out_shape}, expected {OUTPUT} [1, {n_classes}]")


def load_coreml(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """A Core ML package as images -> logits, on macOS (Core ML's runtime exists only on Apple's systems)."""
    if sys.platform != "darwin":
        raise RuntimeError("Core ML models run on macOS and iOS only; this file cannot be run here")
    with _quiet_converter_logs():
        import coremltools as ct

        model = ct.models.MLModel(str(path))
    return lambda x: torch.cat([torch.from_numpy(model.predict({INPUT: x[i:i + 1].numpy()})[OUTPUT]).float()
                                for i in range(len(x))])


def runs_here(fmt: str) -> bool:
    """Whether an export of `fmt` can be run (and so measured) on this machine."""
    return fmt != "coreml" or sys.platform == "darwin"
