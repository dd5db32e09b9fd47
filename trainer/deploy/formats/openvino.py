"""OpenVINO IR, for Intel CPUs, GPUs and NPUs (OpenVINO Runtime, Frigate, OpenVINO Model Server): fp32 (`openvino`)
and int8 (`openvino_int8`: NNCF's post-training quantization, calibrated on training images as ONNX int8 is). Each is
a folder, `model.xml` (the graph) and `model.bin` (the weights), converted from the network by OpenVINO's own
`convert_model`; input `images`, output `logits`, a dynamic batch."""

from __future__ import annotations

from pathlib import Path

GRAPH, WEIGHTS = "model.xml", "model.bin"
# OpenVINO's CPU plugin runs bf16 on a processor that has it unless asked for f32 (0.05 from the checkpoint's logits
# on an AMD EPYC with AVX-512 BF16): the fp32 format runs in fp32, and int8's layers kept in fp32 stay so.
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
MAX_GRAPH_BYTES = 64 * 2**20  # model.xml: the graph without its weights (resnet50's: 0.3 MB); a larger one is refused


def _convert(model, context):
    import openvino as ov
    import torch

    height, width = context.frame.shape
    converted = ov.convert_model(model, example_input=torch.zeros(1, 3, height, width),
                                 input=[ov.PartialShape([-1, 3, height, width])])
    converted.inputs[0].get_tensor().set_names({"images"})
    converted.outputs[0].get_tensor().set_names({"logits"})
    return converted


def _save(converted, path: Path) -> None:
    import openvino as ov

    path.mkdir()
    ov.save_model(converted, str(path / GRAPH), compress_to_fp16=False)


def write_openvino(model, path: Path, context) -> None:
    _save(_convert(model, context), path)


def kept_in_fp32(converted) -> list[str]:
    """The network's ends, which int8 costs the most accuracy for the least speed: its first convolution (the raw
    pixels in) and its last matrix product (the classifier's logits out). On three resnet18 runs on the photographs
    int8 lost 0.6-1.9 points of top-1 with them quantized and -0.6 to 0 points without (docs/deploy.md)."""
    ops = converted.get_ordered_ops()
    convolutions = [op.get_friendly_name() for op in ops if op.get_type_name() == "Convolution"]
    products = [op.get_friendly_name() for op in ops if op.get_type_name() == "MatMul"]
    return convolutions[:1] + products[-1:]


def write_openvino_int8(model, path: Path, context) -> dict:
    import nncf

    from trainer.deploy.formats.onnx import calibration_batches

    batches, where = calibration_batches(context)
    images = [batch[i:i + 1] for batch in batches for i in range(len(batch))]  # NNCF's statistics: one image an item
    converted = _convert(model, context)
    kept = kept_in_fp32(converted)
    quantized = nncf.quantize(converted, nncf.Dataset(images), subset_size=len(images),
                              preset=nncf.QuantizationPreset.MIXED, fast_bias_correction=False,
                              ignored_scope=nncf.IgnoredScope(names=kept, validate=False))
    _save(quantized, path)
    return {"method": "static (NNCF post-training quantization: int8 weights and activations; the first convolution "
                      "and the classifier kept in fp32)",
            "calibration_images": len(images), "calibrated_on": where, "kept_in_fp32": kept}


def recognise_openvino(path: Path) -> bool:
    """An OpenVINO IR folder: its graph is XML naming a network, its weights beside it."""
    graph = Path(path) / GRAPH
    if not Path(path).is_dir() or not graph.is_file() or not (Path(path) / WEIGHTS).is_file():
        return False
    with open(graph, "rb") as f:
        head = f.read(512)
    return head.lstrip().startswith(b"<?xml") and b"<net" in head


recognise_openvino_int8 = recognise_openvino


def load_openvino(path: Path, meta: dict):
    import openvino as ov
    import torch

    from trainer.core.files import UserFileError, read_user_file

    graph = Path(path) / GRAPH
    try:
        read_user_file(graph, MAX_GRAPH_BYTES, "OpenVINO graph")  # bounded before OpenVINO reads it whole
    except UserFileError as e:
        raise UserFileError(f"{e} (OpenVINO graphs without their weights are at most {MAX_GRAPH_BYTES // 2**20} MiB)") \
            from e
    compiled = ov.Core().compile_model(str(graph), "CPU", F32)
    output = compiled.output(0)
    return lambda x: torch.from_numpy(compiled([x.contiguous().numpy()])[output]).float()


load_openvino_int8 = load_openvino


def runtime_openvino() -> str:
    import openvino as ov

    return f"OpenVINO Runtime {ov.get_version().split('-')[0]}, CPU, f32 inference (INFERENCE_PRECISION_HINT)"


runtime_openvino_int8 = runtime_openvino


def snippets_openvino(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"OpenVINO (Python)": f'import openvino as ov\ncompiled = ov.Core().compile_model("{name}/{GRAPH}", "CPU",\n'
                                 '                                   {"INFERENCE_PRECISION_HINT": "f32"})\n'
                                 "logits = compiled([x])[compiled.output(0)]  # x: float32 numpy array",
            "OpenVINO (C++)": f'auto compiled = ov::Core().compile_model("{name}/{GRAPH}", "CPU",\n'
                              "    ov::hint::inference_precision(ov::element::f32));\n"
                              "auto request = compiled.create_infer_request();\n"
                              "request.set_input_tensor(input);  // ov::Tensor, f32\nrequest.infer();\n"
                              "auto logits = request.get_output_tensor();"}


snippets_openvino_int8 = snippets_openvino
