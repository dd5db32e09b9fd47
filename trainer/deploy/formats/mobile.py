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

from trainer.core.errors import ModelError

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


def write_executorch(model: torch.nn.Module, path: Path, context) -> None:
    height, width = context.frame.shape
    with _quiet_converter_logs():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        program = torch.export.export(model, (torch.zeros(1, 3, height, width),))
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(lowered.buffer)


def load_executorch(path: Path, meta: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """An ExecuTorch program as images -> logits; a batch is run one image at a time (the program takes one)."""
    with _quiet_converter_logs():
        try:
            from executorch.runtime import Runtime
        except ImportError as e:
            raise ModelError(f"{path}: needs {e.name}, which is not installed here (pip install {e.name})") from e

        method = Runtime.get().load_program(str(path)).load_method("forward")
    return lambda x: torch.cat([method.execute([x[i:i + 1].contiguous()])[0] for i in range(len(x))])


def write_coreml(model: torch.nn.Module, path: Path, context) -> None:
    (height, width), classes = context.frame.shape, context.reference.classes
    os.environ.setdefault("TQDM_DISABLE", "1")  # coremltools' progress bars: a screenful on stderr per export
    with _quiet_converter_logs():
        import coremltools as ct

        program = torch.export.export(model, (torch.zeros(1, 3, height, width),)).run_decompositions({})
        converted = ct.convert(program, inputs=[ct.TensorType(name=INPUT, shape=(1, 3, height, width))],
                               outputs=[ct.TensorType(name=OUTPUT)], convert_to="mlprogram",
                               minimum_deployment_target=ct.target.iOS16)
    converted.user_defined_metadata["classes"] = ",".join(classes)
    converted.short_description = f"TrainDeck image classifier ({len(classes)} classes)"
    converted.save(str(path))


def check_coreml(path: Path, shape_hw: tuple[int, int], n_classes: int) -> tuple[str, str]:
    """Load a Core ML package back and check its input and output; ValueError naming what differs. (What was
    checked, why it was not run.)"""
    with _quiet_converter_logs():
        import coremltools as ct

        spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    (given,), (produced,) = spec.description.input, spec.description.output
    shape = list(given.type.multiArrayType.shape)
    if given.name != INPUT or shape != [1, 3, *shape_hw]:
        raise ValueError(f"{path}: input {given.name} {shape}, expected {INPUT} [1, 3, {shape_hw[0]}, {shape_hw[1]}]")
    out_shape = list(produced.type.multiArrayType.shape)
    if produced.name != OUTPUT or (out_shape and out_shape[-1] != n_classes):
        raise ValueError(f"{path}: output {produced.name} {out_shape}, expected {OUTPUT} [1, {n_classes}]")
    return ("loaded back with coremltools; its input (images, 1 x 3 x H x W) and output checked",
            "Core ML runs on macOS and iOS only")


def load_coreml(path: Path, meta: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """A Core ML package as images -> logits, on macOS (Core ML's runtime exists only on Apple's systems)."""
    if not runs_here_coreml():
        raise ModelError(f"{path}: Core ML models run on macOS and iOS only; this file cannot be run here")
    with _quiet_converter_logs():
        try:
            import coremltools as ct
        except ImportError as e:
            raise ModelError(f"{path}: needs {e.name}, which is not installed here (pip install {e.name})") from e

        model = ct.models.MLModel(str(path))
    return lambda x: torch.cat([torch.from_numpy(model.predict({INPUT: x[i:i + 1].numpy()})[OUTPUT]).float()
                                for i in range(len(x))])


def runs_here_coreml() -> bool:
    """Core ML's runtime exists on Apple's systems only: elsewhere a package is loaded back and checked, not run."""
    return sys.platform == "darwin"


def runtime_executorch() -> str:
    from importlib.metadata import version

    return f"ExecuTorch {version('executorch')} Python runtime, XNNPACK"


def runtime_coreml() -> str:
    return "Core ML (macOS)"


def snippets_executorch(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"ExecuTorch (Python)": f"from executorch.runtime import Runtime\n"
                                   f'method = Runtime.get().load_program("{name}").load_method("forward")\n'
                                   "logits = method.execute([x])[0]  # x: float32 torch tensor, batch 1",
            "ExecuTorch (Android, Kotlin)": f'val module = Module.load(filesDir.path + "/{name}")\n'
                                            f"val input = Tensor.fromBlob(pixels, longArrayOf(1, 3, {shape[0]}, {shape[1]}))\n"
                                            "val logits = module.forward(EValue.from(input))[0].toTensor()"
                                            ".dataAsFloatArray"}


def snippets_coreml(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"Core ML (Swift)": f'let url = try MLModel.compileModel(at: Bundle.main.url(forResource: "{Path(name).stem}",'
                               ' withExtension: "mlpackage")!)\n'
                               "let model = try MLModel(contentsOf: url)\n"
                               'let logits = try model.prediction(from: MLDictionaryFeatureProvider(dictionary: '
                               '["images": x])).featureValue(for: "logits")!.multiArrayValue!',
            "coremltools (Python, macOS)": f'import coremltools\nmodel = coremltools.models.MLModel("{name}")\n'
                                           'logits = model.predict({"images": x})["logits"]  # x: numpy, batch 1'}
