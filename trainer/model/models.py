"""Building the network: built-in small CNN, any torchvision classifier, or a user's own nn.Module.

Also initialisation schemes (applied with `net.apply`) and safe loading of local pretrained weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import logging
import sys
import types

import torch
from torch import nn

from trainer.core.catalog import BUILTIN_MODELS
from trainer.core.config import ModelConfig, is_user_model
from trainer.core.errors import ModelError
from trainer.core.user_code import trusted_source

log = logging.getLogger(__name__)


class SmallCNN(nn.Module):
    """A compact conv net for small images: trains the demo data in well under a minute on CPU."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(3, width), nn.MaxPool2d(2), block(width, 2 * width), nn.MaxPool2d(2),
                                      block(2 * width, 4 * width), nn.MaxPool2d(2), block(4 * width, 4 * width),
                                      nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class ResNet9(nn.Module):
    """A ResNet-9 of the kind that trains CIFAR-10 fastest (Myrtle.ai's DAWNBench network, airbench's ancestor),
    for images of 48-128 px trained from scratch: a stride-2 stem, then three stages of a convolution, a 2x2 max pool
    and a residual pair of convolutions, widths 2w, 4w, 8w. At w=16 and 96 px: 0.49 M parameters, 0.065 GMACs, 10
    convolutions (small_cnn: 0.24 M, 0.11 GMACs, 4; resnet18: 11 M, 0.33 GMACs). Chosen by measurement on a folder of
    real photographs (docs/benchmarks.md, "A mid-sized network from scratch"): in 5 minutes on a 2-core CPU, w=16 at
    64 px scored 96.6% test top-1 against 93.3% for w=24 at 48 px and 95.8% for small_cnn at 48 px."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()

        def conv(cin, cout, stride=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True))

        def stage(cin, cout):
            return nn.ModuleDict({"down": nn.Sequential(conv(cin, cout), nn.MaxPool2d(2)),
                                  "res": nn.Sequential(conv(cout, cout), conv(cout, cout))})

        self.stem = conv(3, width, stride=2)
        self.stages = nn.ModuleList([stage(width, 2 * width), stage(2 * width, 4 * width),
                                     stage(4 * width, 8 * width)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage["down"](x)
            x = x + stage["res"](x)
        return self.fc(torch.flatten(self.pool(x), 1))


class ResNet10T(nn.Module):
    """timm's resnet10t, built here so that every install has it (timm is an optional extra): a ResNet of one
    BasicBlock a stage (widths 64, 128, 256, 512), a "deep tiered" stem of three 3x3 convolutions (24, 32, 64
    channels, the first of stride 2) and a max pool, and downsampling shortcuts that average-pool before their 1x1
    convolution; each block's last BatchNorm starts at zero. 4.9 M parameters, 0.07 GMACs at 64 px. As Auto's only
    from-scratch candidate on the project's photo JPEGs, 2 minutes, it scored 85.6% test top-1 (median of 3) against
    80.6% for Auto's own candidates (docs/benchmarks.md)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()

        def conv_bn(cin, cout, stride=1, relu=True):
            layers = [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout)]
            return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)

        self.stem = nn.Sequential(conv_bn(3, 24, stride=2), conv_bn(24, 32), conv_bn(32, 64),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        self.blocks = nn.ModuleList()
        self.shortcuts = nn.ModuleList()
        for cin, cout, stride in ((64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)):
            block = nn.Sequential(conv_bn(cin, cout, stride), conv_bn(cout, cout, relu=False))
            nn.init.zeros_(block[1][1].weight)  # the block starts as the identity (timm's zero_init_last)
            self.blocks.append(block)
            self.shortcuts.append(nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for block, shortcut in zip(self.blocks, self.shortcuts):
            x = torch.relu(block(x) + shortcut(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def choose_memory_format(setting: str, model_name: str, model: nn.Module,
                         device: torch.device) -> torch.memory_format:
    """`train.memory_format`; auto = channels_last for built-in / torchvision conv nets on a GPU or on a CPU with
    AVX-512, whose oneDNN channels_last convolutions are the fast ones; contiguous on other CPUs (on an AVX2-only CPU
    contiguous resnet18 trained 7-10% faster, docs/benchmarks.md).

    Your own model keeps the contiguous layout under auto: code such as `x.view(n, -1)` on a
    channels_last activation fails, and only you know whether yours does that.
    """
    if setting == "channels_last":
        return torch.channels_last
    if setting == "contiguous" or is_user_model(model_name):
        return torch.contiguous_format
    if device.type == "cpu" and not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return torch.contiguous_format
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return torch.channels_last if has_conv else torch.contiguous_format


def torchvision_classifiers() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _import_user_model(spec: str, num_classes: int) -> nn.Module:
    """Your own class, built only from a file you trusted at a call (trainer/core/user_code.py), from the bytes that
    were checked."""
    path, cls_name, source = trusted_source(spec)
    module_name = f"traindeck_user_model_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    try:
        sys.modules[module_name] = module  # its classes pickle by this name (spawned DDP ranks, DataLoader workers)
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user trusted these bytes
    except Exception as e:
        raise ModelError(f"model.name: {path} failed to import: {type(e).__name__}: {e}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        found = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, nn.Module)
                 and v.__module__ == module_name]
        raise ModelError(f"model.name: {path} has no class {cls_name!r} (nn.Module classes there: {found or 'none'})")
    try:
        params = inspect.signature(cls).parameters
        model = cls(num_classes=num_classes) if "num_classes" in params else cls()
    except Exception as e:
        raise ModelError(f"model.name: {spec}: constructing {cls_name} failed: {type(e).__name__}: {e}") from e
    if not isinstance(model, nn.Module):
        raise ModelError(f"model.name: {spec}: {cls_name} is not an nn.Module")
    return model


def create_model(cfg: ModelConfig, num_classes: int) -> nn.Module:
    """The network named by model.name with num_classes outputs (weights not yet loaded)."""
    name = cfg.name
    if is_user_model(name):
        return _import_user_model(name, num_classes)
    if name.startswith("timm:"):
        from trainer.model.weights import create_timm

        return create_timm(cfg, num_classes)
    if name in BUILTIN_MODELS:
        module, _, cls_name = BUILTIN_MODELS[name].partition(":")
        return getattr(importlib.import_module(module), cls_name)(num_classes=num_classes)
    import torchvision

    known = torchvision_classifiers()
    if name not in known:
        close = [k for k in known if k.startswith(name[:4])][:6]
        raise ModelError(f"model.name: unknown model {name!r} (built-in: {', '.join(BUILTIN_MODELS)}; torchvision "
                         f"classifiers such as {', '.join(close or known[:6])}; or path/to/file.py:ClassName)")
    kwargs = {"num_classes": num_classes, "weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return torchvision.models.get_model(name, **kwargs)


def apply_init(model: nn.Module, scheme: str) -> None:
    """Re-initialise conv and linear layers with `scheme` using net.apply; 'default' keeps PyTorch's."""
    if scheme == "default":
        return
    inits = {
        "xavier_uniform": nn.init.xavier_uniform_,
        "xavier_normal": nn.init.xavier_normal_,
        "kaiming_normal": lambda w: nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu"),
        "normal": lambda w: nn.init.normal_(w, 0.0, 0.01),
        "constant": lambda w: nn.init.constant_(w, 0.01),
    }
    if scheme not in inits:
        raise ModelError(f"model.init: unknown scheme {scheme!r} (known: default, {', '.join(inits)})")
    init_weight = inits[scheme]

    def init(m: nn.Module) -> None:
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            init_weight(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    model.apply(init)


def check_model(cfg: ModelConfig, num_classes: int) -> nn.Module | None:
    """Before a run starts: the model can be built and its weights file fits it (ModelError otherwise).

    Built on the meta device (no memory, no initialisation work), except your own model, whose code may
    not expect that. Returns the model so built (None for timm models, checked by name).
    """
    from trainer.core.config import is_weights_name

    if cfg.name.startswith("timm:"):
        from trainer.model.weights import check_timm

        check_timm(cfg)  # timm installed, the name known, the weights name one timm takes
        return None
    with contextlib.nullcontext() if is_user_model(cfg.name) else torch.device("meta"):
        model = create_model(cfg, num_classes)
    if is_weights_name(cfg.weights):
        from trainer.model.weights import resolve

        resolve(cfg.name, cfg.weights)  # a name this model offers (fetched when the run starts)
    elif cfg.weights:
        from trainer.model.weights import check_weights_fit, read_state_dict

        check_weights_fit(model, read_state_dict(cfg.weights), cfg.weights, head_name(model))
    return model


def head_name(model: nn.Module) -> str | None:
    """The classifier head: the last Linear layer (fc, classifier.6, heads.head, ...). The one rule for what is
    resized to the dataset when weights are loaded, and what a linear probe trains."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    return last


def build_model(cfg: ModelConfig, num_classes: int, shape: tuple[int, int], seed: int,
                progress=None) -> tuple[nn.Module, dict | None]:
    """Create, initialise, load weights and check that the output has one logit per class.

    Returns the model and what weights were loaded (name, file, sha256), or None for none; `progress` sees the
    bytes of a download.
    """
    torch.manual_seed(seed)
    model = create_model(cfg, num_classes)
    info = None
    if cfg.name.startswith("timm:"):
        info = {"name": cfg.weights, "file": "Hugging Face cache (timm)"} if cfg.weights else None
    else:
        from trainer.model.weights import load_weights

        apply_init(model, cfg.init)
        info = load_weights(model, cfg, head_name(model), progress)
    check_output_size(model, cfg.name, num_classes, shape)
    return model, info


def check_output_size(model: nn.Module, name: str, num_classes: int, shape: tuple[int, int]) -> None:
    """The model takes a batch of `shape` (height, width) images and gives one logit per class; ModelError if not."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, 3, *shape))
    except Exception as e:
        raise ModelError(f"model.name: {name} fails on a batch of {shape[1]}x{shape[0]} images "
                         f"(data.image_size may be too small for it): {type(e).__name__}: {e}") from e
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.shape != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model.name: {name} outputs {shape} for a batch of 2, expected (2, {num_classes}) "
                         f"(one logit per class)")
