"""Names the app and the trainer share: built-in models, suggested torchvision models, export formats.

Torch-free, so the app offers exactly what the trainer accepts without importing torch.
"""

from __future__ import annotations

# model.name -> "module:Class" of TrainDeck's own networks (built by `trainer.model.models`)
BUILTIN_MODELS = {"small_cnn": "trainer.model.models:SmallCNN"}

# torchvision classifiers offered first in the app's model list (any torchvision classifier is accepted)
SUGGESTED_TORCHVISION = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large",
                         "efficientnet_b0", "convnext_tiny", "vit_b_16", "densenet121", "vgg11_bn", "alexnet",
                         "squeezenet1_1")

# export format -> file suffix it is written with; the program formats first, the default first of all
EXPORT_FORMATS = {"exported_program": ".pt2", "onnx": ".onnx", "onnx_int8": ".int8.onnx", "onnx_fp16": ".fp16.onnx",
                  "executorch": ".pte", "coreml": ".mlpackage", "state_dict": ".pt", "safetensors": ".safetensors",
                  "torchscript": ".ts.pt"}
DEFAULT_EXPORT_FORMAT = "exported_program"  # torch.export: what torch 2.14 keeps developing
# format -> what it is, in a line (the app's tooltips, the model card)
EXPORT_DESCRIPTIONS = {
    "exported_program": "torch.export program (fp32), loaded with torch.export.load",
    "onnx": "ONNX (fp32), for ONNX Runtime, OpenCV, TensorRT and most servers",
    "onnx_int8": "ONNX with int8 weights and activations (ONNX Runtime quantization, calibrated on training images): "
                 "about a quarter of the size, faster on CPUs",
    "onnx_fp16": "ONNX with fp16 weights and arithmetic (inputs and outputs stay fp32): half the size, for GPUs",
    "executorch": "ExecuTorch program (.pte, XNNPACK, batch 1) for Android, iOS and embedded Linux",
    "coreml": "Core ML package (.mlpackage, fp16, batch 1) for iOS and macOS apps",
    "state_dict": "the weights alone (torch.save), for the same torchvision model",
    "safetensors": "the weights alone (safetensors), for the same torchvision model",
    "torchscript": "TorchScript (deprecated), for older LibTorch programs",
}
# format -> (the module its converter is, the command that installs it): converters TrainDeck does not depend on
EXPORT_CONVERTERS = {"executorch": ("executorch", "pip install executorch"),
                     "coreml": ("coremltools", "pip install coremltools")}
# format -> why it is kept only for old consumers (shown in the app, printed by `main.py export`)
DEPRECATED_EXPORT_FORMATS = {"torchscript": "TorchScript (torch.jit) is deprecated since torch 2.14; "
                                            "exported_program (torch.export) replaces it"}
# --int8: how onnx_int8 quantizes (auto: static for networks with convolutions, dynamic for the others)
INT8_METHODS = ("auto", "static", "dynamic")
CALIBRATION_IMAGES = 200  # the training images onnx_int8 is calibrated on, by default (a seeded sample)

# the checkpoints of a run that export (and evaluation) can take
RUN_CHECKPOINTS = ("best", "last")
