"""Names the app and the trainer share: built-in models, suggested torchvision models, export formats.

Torch-free, so the app offers exactly what the trainer accepts without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# model.name -> "module:Class" of TrainDeck's own networks (built by `trainer.model.models`)
BUILTIN_MODELS = {"small_cnn": "trainer.model.models:SmallCNN", "resnet9": "trainer.model.models:ResNet9",
                  "resnet10t": "trainer.model.models:ResNet10T"}

# torchvision classifiers offered first in the app's model list (any torchvision classifier is accepted)
SUGGESTED_TORCHVISION = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large",
                         "efficientnet_b0", "convnext_tiny", "vit_b_16", "densenet121", "vgg11_bn", "alexnet",
                         "squeezenet1_1")

@dataclass(frozen=True)
class ExportFormat:
    """One export format, declared once. Its code (writer, loader, the lines that load it in each consumer's API, the
    runtime it is measured in) is in `module`, as functions named after it: `write_NAME`, `load_NAME`,
    `snippets_NAME`, and where they differ from the default `runtime_NAME`, `runs_here_NAME`, `check_NAME`,
    `not_measured_NAME` (trainer/deploy/formats/). Adding a format is one entry and one module."""

    name: str
    suffix: str  # the file suffix it is written with
    description: str  # what it is, in a line (the app's tooltips, the model card)
    module: str
    # what the file is, as recognised from its bytes (a key of trainer.deploy.formats.container.CONTAINERS); None:
    # the module's `recognise_NAME(path) -> bool` says whether a file is one
    container: str | None = None
    graph: bool = True  # a network graph (flip test-time augmentation goes inside it), not weights alone
    one_image: bool = False  # takes batch 1, as apps call it
    converter: tuple[str, str] | None = None  # (the module its converter is, the command that installs it)
    deprecated: str | None = None  # why it is kept only for old consumers
    folder: str | None = None  # an export that is a folder: the file in it that says it is one (Core ML, OpenVINO)
    calibration_folder: bool = False  # `main.py export --calibration FOLDER` calibrates it on that folder's images


# Views of the registry, kept in step by `register_export_format`: name -> suffix (the program formats first, the
# default first of all), description, converter, deprecation.
EXPORT_REGISTRY: dict[str, ExportFormat] = {}
EXPORT_FORMATS: dict[str, str] = {}
EXPORT_DESCRIPTIONS: dict[str, str] = {}
EXPORT_CONVERTERS: dict[str, tuple[str, str]] = {}
DEPRECATED_EXPORT_FORMATS: dict[str, str] = {}


def register_export_format(fmt: ExportFormat) -> None:
    """Add a format: the CLI's choices, the config's check, the Export dialog and `export.formats` all read these."""
    EXPORT_REGISTRY[fmt.name] = fmt
    EXPORT_FORMATS[fmt.name] = fmt.suffix
    EXPORT_DESCRIPTIONS[fmt.name] = fmt.description
    if fmt.converter:
        EXPORT_CONVERTERS[fmt.name] = fmt.converter
    if fmt.deprecated:
        DEPRECATED_EXPORT_FORMATS[fmt.name] = fmt.deprecated


_FORMATS = "trainer.deploy.formats."
for _format in (
    ExportFormat("exported_program", ".pt2", "torch.export program (fp32), loaded with torch.export.load",
                 _FORMATS + "program", "pt2"),
    ExportFormat("onnx", ".onnx", "ONNX (fp32), for ONNX Runtime, OpenCV, TensorRT and most servers", _FORMATS + "onnx",
                 "onnx"),
    ExportFormat("onnx_int8", ".int8.onnx", "ONNX with int8 weights and activations (ONNX Runtime quantization, "
                 "calibrated on training images): about a quarter of the size, faster on CPUs", _FORMATS + "onnx", "onnx",
                 calibration_folder=True),
    ExportFormat("onnx_fp16", ".fp16.onnx", "ONNX with fp16 weights and arithmetic (inputs and outputs stay fp32): "
                 "half the size, for GPUs", _FORMATS + "onnx", "onnx"),
    ExportFormat("executorch", ".pte", "ExecuTorch program (.pte, XNNPACK, batch 1) for Android, iOS and embedded "
                 "Linux", _FORMATS + "mobile", "executorch", one_image=True, converter=("executorch", "pip install executorch")),
    ExportFormat("coreml", ".mlpackage", "Core ML package (.mlpackage, fp16, batch 1) for iOS and macOS apps",
                 _FORMATS + "mobile", "mlpackage", one_image=True, converter=("coremltools", "pip install coremltools"),
                 folder="Manifest.json"),
    ExportFormat("openvino", ".openvino", "OpenVINO IR (a folder: model.xml and model.bin, fp32) for Intel CPUs, GPUs "
                 "and NPUs", _FORMATS + "openvino", converter=("openvino", "pip install -e '.[openvino]'"),
                 folder="model.xml"),
    ExportFormat("openvino_int8", ".int8.openvino", "OpenVINO IR with int8 weights and activations (NNCF, calibrated "
                 "on training images): about a quarter of the size, faster on Intel CPUs", _FORMATS + "openvino",
                 converter=("nncf", "pip install -e '.[openvino]'"), folder="model.xml"),
    ExportFormat("litert", ".tflite", "LiteRT / TensorFlow Lite (.tflite, fp32, batch 1) for Android, embedded Linux "
                 "and Frigate", _FORMATS + "litert", "tflite", one_image=True,
                 converter=("litert_torch", "pip install -e '.[litert]'")),
    ExportFormat("litert_int8", ".int8.tflite", "LiteRT / TensorFlow Lite with int8 weights, activations, input and "
                 "output (calibrated on training images, batch 1): a quarter of the size, for integer-only "
                 "accelerators", _FORMATS + "litert", "tflite", one_image=True,
                 converter=("litert_torch", "pip install -e '.[litert]'")),
    ExportFormat("state_dict", ".pt", "the weights alone (torch.save), for the same torchvision model",
                 _FORMATS + "weights", "torch_save", graph=False),
    ExportFormat("safetensors", ".safetensors", "the weights alone (safetensors), for the same torchvision model",
                 _FORMATS + "weights", "safetensors", graph=False),
    ExportFormat("torchscript", ".ts.pt", "TorchScript (deprecated), for older LibTorch programs", _FORMATS + "program",
                 "torchscript",
                 deprecated="TorchScript (torch.jit) is deprecated since torch 2.14; exported_program (torch.export) "
                            "replaces it"),
):
    register_export_format(_format)
DEFAULT_EXPORT_FORMAT = "exported_program"  # torch.export: what torch 2.14 keeps developing
# --int8: how onnx_int8 quantizes (auto: static for networks with convolutions, dynamic for the others)
INT8_METHODS = ("auto", "static", "dynamic")
CALIBRATION_IMAGES = 200  # the training images onnx_int8 is calibrated on, by default (a seeded sample)

# Auto's time budget (`main.py auto --minutes`, the Dataset page's Auto box): at least, at most (a week)
AUTO_MIN_MINUTES, AUTO_MAX_MINUTES = 0.5, 7 * 24 * 60

# the checkpoints of a run that export (and evaluation) can take
# The ways a run can use its devices, as the Device page offers them: (label, device.parallel, device.launcher); a
# launcher is asked for only with DDP (the trainer starts one-process runs itself)
PARALLEL_MODES = (
    ("One device (CPU or one GPU)", "none", "torchrun"),
    ("DataParallel (one process, several GPUs)", "dp", "torchrun"),
    ("DDP via torchrun", "ddp", "torchrun"),
    ("DDP via mp.spawn", "ddp", "spawn"),
    ("DDP via Horovod", "ddp", "horovod"),
)
LABEL_NEXT_MAX = 500  # `main.py label --next N`: at most this many pool images listed to label next
RUN_CHECKPOINTS = ("best", "last")
