"""ONNX, for ONNX Runtime, OpenCV, TensorRT and most servers: fp32 (`onnx`), int8 (`onnx_int8`: ONNX Runtime's
static quantization calibrated on training images, dynamic for networks without convolutions) and fp16
(`onnx_fp16`, for GPUs). Input `images`, output `logits`, a dynamic batch."""

from __future__ import annotations

from pathlib import Path

ONNX_OPSET = 18  # what the exporter targets well and onnxruntime >= 1.16 runs


def write_onnx(model, path: Path, context) -> None:
    import torch

    example = torch.zeros(2, 3, *context.frame.shape)
    torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                      dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=ONNX_OPSET,
                      dynamo=False)


def write_onnx_fp16(model, path: Path, context) -> dict:
    from trainer.deploy import quantize

    fp32 = Path(context.work) / "fp32.onnx"
    write_onnx(model, fp32, context)
    return quantize.fp16_onnx(fp32, path)


def write_onnx_int8(model, path: Path, context) -> dict:
    from trainer.deploy import quantize

    fp32 = Path(context.work) / "fp32.onnx"
    write_onnx(model, fp32, context)
    method, why = quantize.int8_method(fp32, context.options.int8)
    batches, where = calibration_batches(context) if method == "static" else (None, None)
    done = quantize.int8_onnx(fp32, path, method, batches, context.work)
    return {**done, "why": why, **({"calibrated_on": where} if where else {})}


def calibration_batches(context) -> tuple[list, str]:
    """The calibration images, decoded and normalised as the export's input, in batches; where they come from."""
    import numpy as np
    import torch

    from trainer.deploy.export_data import CalibrationError, calibration_images
    from trainer.deploy.export_measure import readable_images
    from trainer.deploy.quantize import CALIBRATION_BATCH

    reference, options = context.reference, context.options
    config = reference.state["config"]
    paths, where = calibration_images(context.run, config, options.calibration, options.calibration_images,
                                      int(config.get("train", {}).get("seed", 0)))
    pre = reference.preprocess
    images = readable_images(paths, pre.decode)
    if not images:
        raise CalibrationError(f"--calibration: none of the {len(paths)} images chosen could be read ({where})")
    found = pre.to_input(torch.stack(images))
    batches = [np.ascontiguousarray(found[i:i + CALIBRATION_BATCH].numpy())
               for i in range(0, len(found), CALIBRATION_BATCH)]
    return batches, where.replace(f"{len(paths)} images", f"{len(found)} images", 1)


def _session(path: Path):
    import onnxruntime
    import torch

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the threads the checkpoint is timed with (and, on a
    # busy machine, what device.share_cpu left: ONNX Runtime's own default takes every core)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # its threads sleep between runs:
    # spinning, they took the cores from the PyTorch runs timed beside them (the checkpoint 4x slower, issue #69)
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {"images": x.contiguous().numpy()})[0])


load_onnx = load_onnx_int8 = load_onnx_fp16 = lambda path, meta: _session(path)  # noqa: E731


def runtime_onnx() -> str:
    import onnxruntime

    return f"ONNX Runtime {onnxruntime.__version__}, CPUExecutionProvider"


runtime_onnx_int8 = runtime_onnx_fp16 = runtime_onnx


def not_measured_onnx_fp16() -> dict[str, str]:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return {}
    return {"GPU speed": "fp16 is for GPUs; this ONNX Runtime has no CUDA provider (pip install onnxruntime-gpu where "
                         "there is one), so its speed here is the CPU's"}


def snippets_onnx(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"ONNX Runtime (Python)": f'import onnxruntime\nsession = onnxruntime.InferenceSession("{name}")\n'
                                     'logits = session.run(None, {"images": x})[0]  # x: float32 numpy array',
            "ONNX Runtime (C#)": f'using var session = new InferenceSession("{name}");\n'
                                 'var inputs = new[] { NamedOnnxValue.CreateFromTensor("images", x) };  '
                                 '// DenseTensor<float>\nusing var logits = session.Run(inputs);'}


snippets_onnx_int8 = snippets_onnx_fp16 = snippets_onnx
