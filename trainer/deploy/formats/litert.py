"""LiteRT (TensorFlow Lite) `.tflite`, for Android, embedded Linux, microcontrollers, Coral Edge TPUs and Frigate:
fp32 (`litert`) and full-integer int8 (`litert_int8`: int8 weights, activations, input and output, as Edge TPUs and
integer-only accelerators need), converted from the network by Google's `litert-torch` (PyTorch to LiteRT directly,
no ONNX or TensorFlow step) and run here in LiteRT's own interpreter (`ai-edge-litert`). Both take one image (batch
1), as apps call them. int8 is PyTorch's post-training quantization (PT2E, the quantizer litert-torch ships:
symmetric, weights per channel), calibrated on the same training images as ONNX int8.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from trainer.core.errors import ModelError


def _example(context) -> tuple[torch.Tensor]:
    height, width = context.frame.shape
    return (torch.zeros(1, 3, height, width),)


def write_litert(model, path: Path, context) -> None:
    import litert_torch

    litert_torch.convert(model.eval(), _example(context)).export(str(path))


def write_litert_int8(model, path: Path, context) -> dict:
    import litert_torch
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from trainer.deploy.formats.onnx import calibration_batches

    batches, where = calibration_batches(context)
    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    example = _example(context)
    observed = prepare_pt2e(torch.export.export(model.eval(), example).module(), quantizer)
    images = 0
    with torch.no_grad():
        for batch in batches:  # the program takes one image at a time
            for image in torch.from_numpy(batch).split(1):
                observed(image)
                images += 1
    quantized = convert_pt2e(observed, fold_quantize=False)
    litert_torch.convert(quantized, example, quant_config=QuantConfig(pt2e_quantizer=quantizer)).export(str(path))
    return {"method": "static (PyTorch PT2E post-training quantization, litert-torch's quantizer: int8 weights per "
                      "channel, int8 activations, int8 input and output)",
            "calibration_images": images, "calibrated_on": where}


def _interpreter(path: Path):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as e:
        raise ModelError(f"{path}: needs ai-edge-litert, which is not installed here "
                         f"(pip install -e '.[litert]')") from e
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    return interpreter


def load_litert(path: Path, meta: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """A `.tflite` model as images -> logits, one image at a time; an integer model's input is quantized and its
    output dequantized with the scale and zero point the model carries."""
    import numpy as np

    interpreter = _interpreter(path)
    given, produced = interpreter.get_input_details()[0], interpreter.get_output_details()[0]

    def one(image: np.ndarray) -> np.ndarray:
        if np.issubdtype(given["dtype"], np.integer):
            scale, zero = given["quantization"]
            info = np.iinfo(given["dtype"])
            image = np.clip(np.round(image / scale + zero), info.min, info.max).astype(given["dtype"])
        interpreter.set_tensor(given["index"], image)
        interpreter.invoke()
        out = interpreter.get_tensor(produced["index"])
        if np.issubdtype(produced["dtype"], np.integer):
            scale, zero = produced["quantization"]
            out = (out.astype(np.float32) - zero) * scale
        return out.astype(np.float32)

    return lambda x: torch.from_numpy(np.concatenate([one(x[i:i + 1].contiguous().numpy()) for i in range(len(x))]))


load_litert_int8 = load_litert


def runtime_litert() -> str:
    from importlib.metadata import version

    return f"LiteRT {version('ai-edge-litert')} interpreter, CPU"


runtime_litert_int8 = runtime_litert


def snippets_litert(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"LiteRT (Python)": "from ai_edge_litert.interpreter import Interpreter\n"
                               f'interpreter = Interpreter(model_path="{name}"); interpreter.allocate_tensors()\n'
                               "given, produced = interpreter.get_input_details()[0], interpreter.get_output_details()[0]\n"
                               f"interpreter.set_tensor(given['index'], x)  # x: 1 x 3 x {shape[0]} x {shape[1]}\n"
                               "interpreter.invoke(); logits = interpreter.get_tensor(produced['index'])",
            "LiteRT (Android, Kotlin)": f'val interpreter = Interpreter(loadModelFile(context, "{name}"))\n'
                                        f"val logits = Array(1) {{ FloatArray({classes}) }}\n"
                                        "interpreter.run(input, logits)  // input: 1 x 3 x H x W floats"}


def snippets_litert_int8(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    return {"LiteRT int8 (Python)": "import numpy as np\nfrom ai_edge_litert.interpreter import Interpreter\n"
                                    f'interpreter = Interpreter(model_path="{name}"); interpreter.allocate_tensors()\n'
                                    "given, produced = interpreter.get_input_details()[0], interpreter.get_output_details()[0]\n"
                                    "(s, z), (so, zo) = given['quantization'], produced['quantization']\n"
                                    "interpreter.set_tensor(given['index'], np.clip(np.round(x / s + z), -128, 127)"
                                    ".astype(np.int8))\n"
                                    "interpreter.invoke()\n"
                                    "logits = (interpreter.get_tensor(produced['index']).astype(np.float32) - zo) * so"}
