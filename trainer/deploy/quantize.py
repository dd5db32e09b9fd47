"""Smaller ONNX files from an fp32 ONNX export: int8 with ONNX Runtime's quantization tools, fp16 with its converter.

int8 `static` (the default for networks with convolutions): weights per channel as int8, activations as uint8 with
ranges calibrated by running the network on sample images (min/max), in the QDQ form every ONNX Runtime execution
provider reads. `dynamic` (networks without convolutions: transformers, MLPs): weights as int8, activation ranges
computed as each batch runs, so no calibration. That split is ONNX Runtime's own advice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from trainer.core.catalog import INT8_METHODS

log = logging.getLogger(__name__)

CALIBRATION_BATCH = 16


def int8_method(fp32: Path, requested: str) -> tuple[str, str]:
    """(static | dynamic, why) for `--int8 requested`."""
    if requested not in INT8_METHODS:
        raise ValueError(f"--int8: {requested!r} is not one of {', '.join(INT8_METHODS)}")
    if requested != "auto":
        return requested, "asked for (--int8)"
    import onnx

    ops = {node.op_type for node in onnx.load(str(fp32), load_external_data=False).graph.node}
    if "Conv" in ops:
        return "static", "the network has convolutions: static quantization, calibrated on images"
    return "dynamic", "the network has no convolutions (attention, MLP): dynamic quantization of its weights"


class _Batches:
    """ONNX Runtime's CalibrationDataReader protocol over an iterable of float32 input batches."""

    def __init__(self, batches: Iterable[np.ndarray]):
        self._it: Iterator[np.ndarray] = iter(batches)

    def get_next(self) -> dict | None:
        batch = next(self._it, None)
        return None if batch is None else {"images": batch}

    def rewind(self) -> None:  # not needed by min/max calibration, which reads once
        pass


def int8_onnx(fp32: Path, out: Path, method: str, calibration: Iterable[np.ndarray] | None, work: Path) -> dict:
    """Quantize `fp32` into `out` (static needs `calibration`, float32 input batches); `work` is a folder for the
    intermediate file. Returns what was done, for the model card."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = work / "prepared.onnx"
    try:  # shape inference and graph optimisation first, as ONNX Runtime recommends
        quant_pre_process(str(fp32), str(prepared))
    except Exception as e:  # noqa: BLE001 - an optimisation it cannot do is not a reason to stop
        log.warning("ONNX pre-processing for quantization skipped (%s)", e)
        prepared = fp32
    if method == "dynamic":
        quantize_dynamic(str(prepared), str(out), weight_type=QuantType.QInt8, per_channel=True)
        return {"method": "dynamic", "weights": "int8, per channel", "activations": "uint8, ranges computed per batch"}
    counter = _Counted(calibration or ())
    quantize_static(str(prepared), str(out), _Batches(counter), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    # (not CalibMaxIntermediateOutputs: in ONNX Runtime 1.32 it drops the batches before each flush; min/max
    # calibration keeps only each batch's per-tensor minimum and maximum anyway, so memory is no reason for it)
    return {"method": "static", "format": "QDQ", "weights": "int8, per channel",
            "activations": "uint8, min/max ranges from the calibration images", "calibration_images": counter.images}


class _Counted:
    """Passes batches through, counting the images."""

    def __init__(self, batches: Iterable[np.ndarray]):
        self.batches, self.images = batches, 0

    def __iter__(self):
        for batch in self.batches:
            self.images += len(batch)
            yield batch


def fp16_onnx(fp32: Path, out: Path) -> dict:
    """`fp32` with fp16 weights and arithmetic into `out`; inputs and outputs stay float32, so callers do not change."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(out))
    return {"method": "fp16", "weights": "fp16", "inputs_outputs": "float32"}
