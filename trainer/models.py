"""Building the network: built-in small CNN, any torchvision classifier, or a user's own nn.Module.

Also initialisation schemes (applied with `net.apply`) and safe loading of local pretrained weights.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import sys
from pathlib import Path

import torch
from torch import nn

from trainer.catalog import BUILTIN_MODELS
from trainer.config import ModelConfig, is_user_model
from trainer.errors import InputError
from trainer.groups import is_head_parameter

log = logging.getLogger(__name__)


class ModelError(InputError, ValueError):
    """A model that cannot be built or loaded; the message names the key or file."""


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
    path_str, _, cls_name = spec.rpartition(":")
    path = Path(path_str)
    if not path.is_file():
        raise ModelError(f"model.name: {path} does not exist")
    module_name = f"traindeck_user_model_{abs(hash(str(path.resolve())))}"
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
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
        from trainer.weights import create_timm

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


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors file or a torch file loaded with weights_only=True (never full unpickling)."""
    from trainer.checkpoint import UnsafeFileError, check_layout, load_weights_only

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model.weights: {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:
            raise ModelError(f"model.weights: {path} is not a valid safetensors file: {e}") from e
    try:
        obj = load_weights_only(path)
    except UnsafeFileError as e:
        raise ModelError(f"model.weights: {e}") from e
    except Exception as e:  # noqa: BLE001 - truncated or not a torch file at all
        raise ModelError(f"model.weights: {path} cannot be read as weights ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''})") from e
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        try:
            obj = check_layout(obj, path)["model"]  # a TrainDeck checkpoint
        except ValueError as e:
            raise ModelError(f"model.weights: {e}") from e
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelError(f"model.weights: {path} does not hold a state_dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def check_weights_fit(model: nn.Module, incoming: dict[str, torch.Tensor], path: str | Path) -> set[str]:
    """The keys of `model`'s classifier head that `incoming` does not fit (they stay re-initialised).

    Raises ModelError naming the mismatching keys when the weights are for another architecture.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in incoming]
    unexpected = [k for k in incoming if k not in own]
    wrong_shape = [k for k in own if k in incoming and incoming[k].shape != own[k].shape]
    head = {k for k in missing + wrong_shape if _is_head(model, k)}
    fatal = [k for k in missing + wrong_shape if k not in head] + unexpected
    if fatal:
        details = []
        if missing:
            details.append(f"missing {_few([k for k in missing if k not in head])}")
        if unexpected:
            details.append(f"unexpected {_few(unexpected)}")
        if wrong_shape:
            details.append("shape mismatch " + _few([f"{k} {tuple(incoming[k].shape)} vs {tuple(own[k].shape)}"
                                                     for k in wrong_shape if k not in head]))
        raise ModelError(f"model.weights: {path} does not fit this model ({'; '.join(d for d in details if d)})")
    return head


def load_pretrained(model: nn.Module, path: str | Path) -> list[str]:
    """Load matching weights; a classifier head of another size is left re-initialised.

    Returns the names left re-initialised.
    """
    incoming = read_state_dict(path)
    head = check_weights_fit(model, incoming, path)
    model.load_state_dict({k: v for k, v in incoming.items() if k not in head}, strict=False)
    if head:
        log.info("loaded %s; classifier head re-initialised for this dataset: %s", path, ", ".join(sorted(head)))
    return sorted(head)


def check_model(cfg: ModelConfig, num_classes: int) -> nn.Module | None:
    """Before a run starts: the model can be built and its weights file fits it (ModelError otherwise).

    Built on the meta device (no memory, no initialisation work), except your own model, whose code may
    not expect that. Returns the model so built (None for timm models, checked by name).
    """
    from trainer.config import is_weights_name

    if cfg.name.startswith("timm:"):
        from trainer.weights import check_timm

        check_timm(cfg)  # timm installed, the name known, the weights name one timm takes
        return None
    with contextlib.nullcontext() if is_user_model(cfg.name) else torch.device("meta"):
        model = create_model(cfg, num_classes)
    if is_weights_name(cfg.weights):
        from trainer.weights import resolve

        resolve(cfg.name, cfg.weights)  # a name this model offers (fetched when the run starts)
    elif cfg.weights:
        check_weights_fit(model, read_state_dict(cfg.weights), cfg.weights)
    return model


def head_name(model: nn.Module) -> str | None:
    """The classifier head: the last Linear layer (fc, classifier.6, heads.head, ...). The one rule for what is
    resized to the dataset when weights are loaded, and what a linear probe trains."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name
    return last


def _is_head(model: nn.Module, key: str) -> bool:
    return is_head_parameter(head_name(model), key)


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else ""


def build_model(cfg: ModelConfig, num_classes: int, image_size: int, seed: int,
                progress=None) -> tuple[nn.Module, dict | None]:
    """Create, initialise, load weights and check that the output has one logit per class.

    Returns the model and what weights were loaded (name, file, sha256), or None for none; `progress` sees the
    bytes of a download.
    """
    from trainer.config import is_weights_name

    torch.manual_seed(seed)
    model = create_model(cfg, num_classes)
    info = None
    if cfg.name.startswith("timm:"):
        info = {"name": cfg.weights, "file": "Hugging Face cache (timm)"} if cfg.weights else None
    else:
        apply_init(model, cfg.init)
        if is_weights_name(cfg.weights):
            from trainer.weights import load_named

            info = load_named(model, cfg, progress)
        elif cfg.weights:
            from trainer.weights import sha256_of

            load_pretrained(model, cfg.weights)
            info = {"name": None, "file": str(cfg.weights), "sha256": sha256_of(Path(cfg.weights))}
    check_output_size(model, cfg.name, num_classes, image_size)
    return model, info


def check_output_size(model: nn.Module, name: str, num_classes: int, image_size: int) -> None:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, 3, image_size, image_size))
    except Exception as e:
        raise ModelError(f"model.name: {name} fails on a batch of {image_size}x{image_size} images "
                         f"(data.image_size may be too small for it): {type(e).__name__}: {e}") from e
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.shape != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model.name: {name} outputs {shape} for a batch of 2, expected (2, {num_classes}) "
                         f"(one logit per class)")
