"""Names the app and the trainer share: built-in models, suggested torchvision models, export formats.

Torch-free, so the app offers exactly what the trainer accepts without importing torch.
"""

from __future__ import annotations

# model.name -> "module:Class" of TrainDeck's own networks (built by `trainer.models`)
BUILTIN_MODELS = {"small_cnn": "trainer.models:SmallCNN"}

# torchvision classifiers offered first in the app's model list (any torchvision classifier is accepted)
SUGGESTED_TORCHVISION = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large",
                         "efficientnet_b0", "convnext_tiny", "vit_b_16", "densenet121", "vgg11_bn", "alexnet",
                         "squeezenet1_1")

# export format -> file suffix it is written with; the program formats first, the default first of all
EXPORT_FORMATS = {"exported_program": ".pt2", "onnx": ".onnx", "state_dict": ".pt", "safetensors": ".safetensors",
                  "torchscript": ".ts.pt"}
DEFAULT_EXPORT_FORMAT = "exported_program"  # torch.export: what torch 2.14 keeps developing
# format -> why it is kept only for old consumers (shown in the app, printed by `main.py export`)
DEPRECATED_EXPORT_FORMATS = {"torchscript": "TorchScript (torch.jit) is deprecated since torch 2.14; "
                                            "exported_program (torch.export) replaces it"}

# the checkpoints of a run that export (and evaluation) can take
RUN_CHECKPOINTS = ("best", "last")
