"""Pretrained weights by name: torchvision's published weights, fetched into the torch hub cache.

A name is whatever `torchvision.models.get_model_weights(model)` lists (DEFAULT, IMAGENET1K_V1, ...). The file is
kept where torchvision keeps it (`$TORCH_HOME/hub/checkpoints/`, under torchvision's own file name), so a file
fetched by torchvision, by `main.py fetch-weights` or by a run is the same file. A cached file is used with no network
at all; a download streams to a temporary file with progress, is checked against the hash prefix in its name (as
torch.hub does) and renamed into place. timm models (`timm:NAME`) load through timm and the Hugging Face cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from trainer.core.config import IMAGENET_MEAN, IMAGENET_STD, ModelConfig, is_weights_name
from trainer.core.errors import ModelError, first_line
from trainer.core.groups import is_head_parameter

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes in all; 0 when unknown)
HASH_IN_NAME = re.compile(r"-([a-f0-9]+)\.")  # torch.hub's rule: resnet18-f37072fd.pth
DOWNLOAD_TIMEOUT_S = 30
TIMM_PREFIX = "timm:"
TIMM_INSTALL = "pip install -e '.[timm]' (or pip install timm)"
MIRROR_ENV = "TRAINDECK_WEIGHTS_MIRROR"  # an http(s) address to download published weights from instead: BASE/FILE


class WeightsUnavailable(ModelError):
    """Named weights that are not cached and cannot be downloaded here."""


@dataclass
class NamedWeights:
    model: str
    name: str  # the enum member it resolved to (DEFAULT -> IMAGENET1K_V1)
    url: str
    mean: list[float]
    std: list[float]

    @property
    def file(self) -> Path:
        return hub_checkpoints() / os.path.basename(urlparse(self.url).path)

    @property
    def cached(self) -> bool:
        return self.file.is_file()

    @property
    def source(self) -> str:
        """Where a download fetches the file: torchvision's address, or the same file name under the address in
        TRAINDECK_WEIGHTS_MIRROR (a lab's mirror; the tests' local server)."""
        mirror = os.environ.get(MIRROR_ENV, "").strip().rstrip("/")
        if not mirror:
            return self.url
        if urlparse(mirror).scheme not in ("http", "https"):
            raise WeightsUnavailable(f"{MIRROR_ENV}: {mirror!r} is not an http(s) address")
        return f"{mirror}/{self.file.name}"

    @property
    def megabytes(self) -> float | None:
        """The file's size as torchvision publishes it (MB), when it does."""
        import torchvision

        size = torchvision.models.get_model_weights(self.model)[self.name].meta.get("_file_size")
        return float(size) if size else None


def hub_checkpoints() -> Path:
    """torchvision's download folder: $TORCH_HOME/hub/checkpoints (default ~/.cache/torch/hub/checkpoints)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def is_timm(model_name: str) -> bool:
    return model_name.startswith(TIMM_PREFIX)


def weights_names(model_name: str) -> list[str]:
    """The weights names `model_name` offers (DEFAULT first)."""
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(model_name)
    except (ValueError, KeyError):
        return []
    return ["DEFAULT", *[m for m in enum.__members__ if m != "DEFAULT"]]


def resolve(model_name: str, weights: str) -> NamedWeights:
    """The published weights `weights` of torchvision's `model_name`; ModelError listing the choices otherwise."""
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(model_name)
    except (ValueError, KeyError) as e:
        raise ModelError(f"model.weights: {weights}: {model_name} has no published weights (use a local file, or "
                         f"a torchvision classifier)") from e
    try:
        member = enum.verify(weights)
    except (ValueError, KeyError) as e:
        raise ModelError(f"model.weights: {model_name} has no weights {weights!r} (available: "
                         f"{', '.join(weights_names(model_name))})") from e
    transform = member.transforms()
    return NamedWeights(model_name, member.name, member.url, list(transform.mean), list(transform.std))


def fetch(named: NamedWeights, progress: Progress | None = None) -> Path:
    """The weights file, from the cache or downloaded into it (never a network call when it is cached)."""
    if named.cached:
        return named.file
    folder = named.file.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        download(named.source, named.file, progress)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise WeightsUnavailable(
            f"model.weights: {named.name} for {named.model} is not in the cache and cannot be downloaded here "
            f"({reason}); download {named.source} and put it, named {named.file.name}, into {folder} (or run "
            f"`main.py fetch-weights {named.model} {named.name}` where there is network)") from e
    except OSError as e:
        raise WeightsUnavailable(f"model.weights: cannot save {named.file.name} into {folder}: {e.strerror or e}") from e
    return named.file


def fetch_named(cfg: ModelConfig, progress: Progress | None = None) -> Path | None:
    """The file of `model.weights` when it names torchvision weights (cached or downloaded now); None otherwise."""
    if not is_weights_name(cfg.weights) or is_timm(cfg.name):
        return None
    return fetch(resolve(cfg.name, cfg.weights), progress)


def download(url: str, dest: Path, progress: Progress | None = None) -> None:
    """Stream `url` to a temporary file beside `dest`, check the hash in its name, rename into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            log.info("downloading %s (%.1f MB) into %s", url, total / 1e6, dest.parent)
            while chunk := response.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
        expected = HASH_IN_NAME.search(dest.name)
        if expected and not digest.hexdigest().startswith(expected.group(1)):
            raise WeightsUnavailable(f"model.weights: {url} arrived damaged (sha256 {digest.hexdigest()[:12]}..., "
                                     f"expected {expected.group(1)}...); try again")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def model_store() -> dict:
    """Every torchvision classifier with its default weights' published figures (torchvision's offline metadata)
    and whether the file is already in the cache: the Model page's table."""
    import torchvision

    rows = []
    for name in sorted(torchvision.models.list_models(module=torchvision.models)):
        try:
            enum = torchvision.models.get_model_weights(name)
        except (ValueError, KeyError):
            continue
        default = enum.DEFAULT
        meta = default.meta
        named = NamedWeights(name, default.name, default.url, [], [])
        rows.append({"name": name, "weights": weights_names(name), "default": default.name,
                     "params": meta.get("num_params"), "gflops": meta.get("_ops"),
                     "acc1": next(iter(meta.get("_metrics", {}).values()), {}).get("acc@1"),
                     "size_mb": meta.get("_file_size"), "min_size": meta.get("min_size", [1, 1])[0],
                     "cached": named.cached, "file": str(named.file), "url": default.url})
    return {"models": rows, "cache": str(hub_checkpoints())}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def load_weights(model: nn.Module, cfg: ModelConfig, head_module: str | None,
                 progress: Progress | None = None) -> dict | None:
    """The one loader of `model.weights` into a built model: a published name (fetched into torchvision's cache)
    or a local file; the classifier head `head_module` is resized to the dataset. What was loaded (name, file,
    sha256), for `run_start`, or None without weights."""
    if is_weights_name(cfg.weights):
        return load_named(model, cfg, head_module, progress)
    if cfg.weights:
        load_file_weights(model, cfg.weights, head_module)
        return {"name": None, "file": str(cfg.weights), "sha256": sha256_of(Path(cfg.weights))}
    return None


def load_named(model: nn.Module, cfg: ModelConfig, head_module: str | None, progress: Progress | None = None) -> dict:
    """Load the published weights `cfg.weights` into `model` (its head resized to the dataset, as for local
    files); what was loaded, for `run_start`: name, file, sha256."""
    from trainer.model.checkpoint import load_weights_only

    named = resolve(cfg.name, cfg.weights)
    path = fetch(named, progress)
    try:
        state = load_weights_only(path)
    except Exception as e:  # noqa: BLE001 - a damaged cached file: say which and how to recover
        raise ModelError(f"model.weights: {path} cannot be read ({type(e).__name__}); delete it to download it "
                         f"again") from e
    head = check_weights_fit(model, state, path, head_module)
    model.load_state_dict({k: v for k, v in state.items() if k not in head}, strict=False)
    log.info("loaded %s weights %s from %s%s", cfg.name, named.name, path,
             f"; classifier head re-initialised: {', '.join(sorted(head))}" if head else "")
    return {"name": named.name, "file": str(path), "sha256": sha256_of(path), "url": named.url}


def normalisation(cfg: ModelConfig) -> tuple[list[float], list[float], str]:
    """(mean, std, where from) that `data.mean/std: auto` means for this model and weights."""
    if is_weights_name(cfg.weights):
        if is_timm(cfg.name):
            pretrained = timm_pretrained_cfg(cfg.name)
            return list(pretrained["mean"]), list(pretrained["std"]), f"the {cfg.name} pretrained config"
        named = resolve(cfg.name, cfg.weights)
        return named.mean, named.std, f"the {named.name} weights of {cfg.name}"
    return list(IMAGENET_MEAN), list(IMAGENET_STD), "ImageNet (no named weights)"


def resolve_normalisation(mean, std, cfg: ModelConfig) -> tuple[list[float], list[float], str]:
    """`data.mean` / `data.std` in effect: as set, or what `auto` means for this model."""
    auto_mean, auto_std, source = normalisation(cfg) if "auto" in (mean, std) else (None, None, "data.mean/std")
    return (auto_mean if mean == "auto" else list(mean)), (auto_std if std == "auto" else list(std)), source


# ---- timm, where installed ------------------------------------------------------------------------------

def require_timm():
    try:
        import timm
    except ImportError as e:
        raise ModelError(f"model.name: timm models need timm, which is not installed here: {TIMM_INSTALL}") from e
    return timm


def timm_pretrained_cfg(model_name: str) -> dict:
    timm = require_timm()
    name = model_name.removeprefix(TIMM_PREFIX)
    try:
        return timm.models.get_pretrained_cfg(name).to_dict()
    except Exception as e:  # noqa: BLE001 - unknown names raise differently across timm versions
        raise ModelError(f"model.name: timm has no pretrained model {name!r}") from e


def check_timm(cfg: ModelConfig):
    """timm is installed, knows the model, and the weights are DEFAULT or none; the timm module."""
    timm = require_timm()
    name = cfg.name.removeprefix(TIMM_PREFIX)
    if name not in timm.list_models():
        close = timm.list_models(f"{name[:4]}*")[:6]
        raise ModelError(f"model.name: timm has no model {name!r} (such as: {', '.join(close) or 'see timm.list_models()'})")
    if cfg.weights not in (None, "", "DEFAULT"):
        raise ModelError(f"model.weights: timm models take DEFAULT (their pretrained weights) or none, got "
                         f"{cfg.weights!r}")
    return timm


def create_timm(cfg: ModelConfig, num_classes: int) -> torch.nn.Module:
    """A timm model with `num_classes` outputs; with `weights: DEFAULT` its pretrained weights, loaded by timm
    from the Hugging Face cache (offline when cached; HF_HUB_OFFLINE is respected)."""
    timm = check_timm(cfg)
    name = cfg.name.removeprefix(TIMM_PREFIX)
    try:
        return timm.create_model(name, pretrained=cfg.weights == "DEFAULT", num_classes=num_classes)
    except Exception as e:  # noqa: BLE001 - offline and not cached, or a hub error: name it
        raise WeightsUnavailable(f"model.weights: DEFAULT for {cfg.name}: timm could not load its pretrained weights "
                                 f"({first_line(e)}); fetch "
                                 f"them where there is network (`main.py fetch-weights {cfg.name}`), they are kept "
                                 f"in the Hugging Face cache") from e


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors file or a torch file loaded with weights_only=True (never full unpickling)."""
    from trainer.model.checkpoint import UnsafeFileError, check_layout, load_weights_only

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
        raise ModelError(f"model.weights: {path} cannot be read as weights ({first_line(e)})") from e
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        try:
            obj = check_layout(obj, path)["model"]  # a TrainDeck checkpoint
        except ValueError as e:
            raise ModelError(f"model.weights: {e}") from e
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelError(f"model.weights: {path} does not hold a state_dict (a mapping of names to tensors)")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def check_weights_fit(model: nn.Module, incoming: dict[str, torch.Tensor], path: str | Path,
                      head_module: str | None, key: str = "model.weights") -> set[str]:
    """The keys of `model`'s classifier head (module `head_module`) that `incoming` does not fit (they stay
    re-initialised).

    Raises ModelError naming the mismatching keys when the weights are for another architecture.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in incoming]
    unexpected = [k for k in incoming if k not in own]
    wrong_shape = [k for k in own if k in incoming and incoming[k].shape != own[k].shape]
    head = {k for k in missing + wrong_shape if is_head_parameter(head_module, k)}
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
        raise ModelError(f"{key}: {path} does not fit this model ({'; '.join(d for d in details if d)})")
    return head


def load_file_weights(model: nn.Module, path: str | Path, head_module: str | None) -> list[str]:
    """Load matching weights from a local file; a classifier head of another size is left re-initialised.

    Returns the names left re-initialised.
    """
    incoming = read_state_dict(path)
    head = check_weights_fit(model, incoming, path, head_module)
    model.load_state_dict({k: v for k, v in incoming.items() if k not in head}, strict=False)
    if head:
        log.info("loaded %s; classifier head re-initialised for this dataset: %s", path, ", ".join(sorted(head)))
    return sorted(head)


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else ""
