"""The one inference path: load a trained model, preprocess images as training did, classify them.

`main.py evaluate`, `main.py predict` (and so the app's Try it), Grad-CAM and the trainer's own best-epoch
validation predictions all go through here, so they agree: the same decoding (`data.decode_image`), the same
normalisation arithmetic as the training batches (`Preprocess.to_input`), eval mode, and for a run's checkpoint
the run's own precision and memory format. An exported file runs as it was exported (fp32, or the int8/fp16 of its conversion).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer.core.catalog import EXPORT_FORMATS
from trainer.core.config import ModelConfig
from trainer.core.errors import InputError, first_line
from trainer.core.files import UserFileError, read_user_file
from trainer.core.rundir import RunDir
from trainer.data.frame import Frame
from trainer.data.loader import Normalise, decode_image
from trainer.deploy import formats
from trainer.deploy.formats.container import check_format_file
from trainer.device.precision import autocast
from trainer.model.checkpoint import UnsafeFileError, read_checkpoint
from trainer.model.models import create_model

log = logging.getLogger(__name__)

BATCH = 64
MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last}


class ModelFileError(InputError, ValueError):
    """A checkpoint or exported model that cannot be used (missing, damaged, not TrainDeck's); the file is named."""


@dataclass(frozen=True)
class Preprocess:
    """How images become the network's input: decode to `frame` (its size and fit), normalise with mean/std, in
    `memory_format`, under `precision`'s autocast."""

    frame: Frame
    mean: tuple[float, ...]
    std: tuple[float, ...]
    precision: str = "fp32"
    memory_format: str = "contiguous_format"
    tta: bool = False  # eval.tta: the logits averaged with the mirror image's
    _normalise: dict = field(default_factory=dict, compare=False, repr=False)  # device -> Normalise

    @classmethod
    def from_record(cls, record: dict, *, exported: bool = False) -> Preprocess:
        """From a checkpoint's `preprocess` (older checkpoints lack precision and memory format: fp32, contiguous)
        or an export's sidecar (always fp32 and contiguous: an exported graph runs as exported, its flip average
        inside it; exported weights leave that to the caller: `tta: caller`)."""
        tta = record.get("tta") == "caller" if exported else bool(record.get("tta", False))
        return cls(Frame.from_record(record), tuple(record["mean"]), tuple(record["std"]),
                   "fp32" if exported else record.get("precision", "fp32"),
                   "contiguous_format" if exported else record.get("memory_format", "contiguous_format"), tta)

    def decode(self, path: str) -> torch.Tensor:
        return decode_image(path, self.frame)

    def to_input(self, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """A uint8 (N, 3, H, W) batch as the network's input (the training batches' `Normalise`)."""
        key = str(device)
        if key not in self._normalise:  # once per device: not a host-to-device copy of mean/std every batch
            self._normalise[key] = Normalise(self.mean, self.std, device, MEMORY_FORMATS[self.memory_format])
        return self._normalise[key](images.to(device).float())

    def autocast(self, device_type: str = "cpu"):
        return autocast(self.precision, device_type)


@dataclass
class LoadedModel:
    """A network ready to classify: images -> logits, its classes and its preprocessing."""

    net: Callable[[torch.Tensor], torch.Tensor]
    classes: list[str]
    preprocess: Preprocess
    source: Path | None = None  # the checkpoint or exported file (None: the network a run is training)
    state: dict | None = None  # a checkpoint's whole content (None for an export)
    meta: dict = field(default_factory=dict)  # an export's sidecar
    thresholds: list[float] | None = None  # multi-label: each label's threshold (sigmoid outputs); None: one class

    @property
    def multilabel(self) -> bool:
        return self.thresholds is not None

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Each class's probability (softmax), or multi-label each label's (sigmoid)."""
        return torch.sigmoid(logits.float()) if self.multilabel else logits.float().softmax(1)

    def logits(self, images: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        """float32 logits of a uint8 batch, in inference mode, on `device` (default the CPU)."""
        device = device or torch.device("cpu")
        with torch.inference_mode(), self.preprocess.autocast(device.type):
            x = self.preprocess.to_input(images, device)
            if self.preprocess.tta:
                return flip_average(self.net, x)
            return self.net(x).float()


def flip_average(net: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """eval.tta: the mean of the logits of `x` and of its mirror image (float32)."""
    return (net(x).float() + net(x.flip(3)).float()) / 2


class FlipAveraged(torch.nn.Module):
    """A network with eval.tta built in, for exported graphs."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return flip_average(self.net, images)


def load_run_model(run: RunDir, which: str = "best") -> LoadedModel:
    """A run's `which` checkpoint (best | last), in eval mode, with the run's preprocessing and precision."""
    path = run.checkpoints / f"{which}.pt"
    if not path.exists():
        raise ModelFileError(f"{path}: no such checkpoint (has the run finished an epoch?)")
    try:
        state = read_checkpoint(path)
    except (UnsafeFileError, ValueError) as e:
        raise ModelFileError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - a damaged file, in whatever way torch reports it
        raise ModelFileError(f"{path}: cannot be read ({first_line(e)})") from e
    model = create_model(ModelConfig(name=state["model_name"]), len(state["classes"]))
    model.load_state_dict(state["model"])
    pre = Preprocess.from_record(state["preprocess"])
    model = model.to(memory_format=MEMORY_FORMATS[pre.memory_format]).eval()
    thresholds = None
    if (state["config"].get("data") or {}).get("labels"):  # multi-label: the thresholds validation chose
        from trainer.deploy.multilabel import run_thresholds

        thresholds = run_thresholds(run.path, list(state["classes"]))
    return LoadedModel(model, list(state["classes"]), pre, path, state=state, thresholds=thresholds)


def load_model(source: Path, which: str = "best") -> LoadedModel:
    """A run directory (its `which` checkpoint) or an exported model file (or Core ML's package folder) with its
    `.json` sidecar."""
    sidecar_path = Path(f"{source}.json")
    if source.is_dir() and not sidecar_path.is_file():
        return load_run_model(RunDir(source), which)
    if not source.exists():
        raise ModelFileError(f"{source}: no such model file or run directory")
    if not sidecar_path.exists():
        raise ModelFileError(f"{sidecar_path}: missing (written by `main.py export` beside the model)")
    meta, pre, fmt, classes, thresholds = read_sidecar(sidecar_path)
    try:
        net = _load_export(source, fmt, meta)
    except InputError as e:
        raise ModelFileError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - truncated or damaged files fail deep inside each loader
        raise ModelFileError(f"{source}: cannot load the {fmt} model, the file looks damaged or truncated "
                             f"({first_line(e)})") from e
    loaded = LoadedModel(net, classes, pre, source, meta=meta, thresholds=thresholds)
    check_agrees(loaded, sidecar_path)
    return loaded


MAX_SIDECAR_BYTES = 16 << 20  # an export's card: its classes, measurements and snippets (a few kB to a few MB)
MAX_CLASSES = 100_000  # classes (or labels) a model may have


def read_sidecar(path: Path) -> tuple[dict, Preprocess, str, list[str], list[float] | None]:
    """(card, preprocessing, format, classes, thresholds) of an export's `.json`, each checked against what a model
    could be: a frame within data.image_size's limits, classes that are names, one threshold per label."""
    from trainer.core.config import key_meta

    try:
        meta = json.loads(read_user_file(path, MAX_SIDECAR_BYTES, "export description"))
        if not isinstance(meta, dict):
            raise TypeError(f"a JSON {type(meta).__name__}, not an object")
        pre = Preprocess.from_record(meta, exported=True)
        fmt, classes = str(meta["format"]), meta["classes"]
        thresholds = [float(t) for t in meta["thresholds"]] if meta.get("thresholds") is not None else None
    except UserFileError as e:
        raise ModelFileError(str(e)) from e
    except (ValueError, KeyError, TypeError) as e:
        raise ModelFileError(f"{path}: not a TrainDeck export description ({first_line(e)})") from e
    size = key_meta("data.image_size")
    low, high = size.get("ge") or 8, size.get("le") or 1024
    for name, side in (("image_size", pre.frame.height), ("image_width", pre.frame.width)):
        if not low <= side <= high:
            raise ModelFileError(f"{path}: {name} {side} is outside what a model takes ({low} to {high} px)")
    if not isinstance(classes, list) or not 1 <= len(classes) <= MAX_CLASSES or \
            not all(isinstance(c, str) for c in classes):
        raise ModelFileError(f"{path}: classes must be a list of 1 to {MAX_CLASSES:,} names")
    if len(pre.mean) != 3 or len(pre.std) != 3 or not all(math.isfinite(v) and v > 0 for v in pre.std):
        raise ModelFileError(f"{path}: mean and std must be three numbers each (std above 0)")
    if thresholds is not None and len(thresholds) != len(classes):
        raise ModelFileError(f"{path}: {len(thresholds)} thresholds for {len(classes)} labels")
    return meta, pre, fmt, list(classes), thresholds


def check_agrees(model: LoadedModel, sidecar: Path) -> None:
    """The exported model takes the card's frame and gives one finite logit per class it names (one image of
    zeros, before any of the user's images): a card of another model, or a damaged file, is named here."""
    height, width = model.preprocess.frame.shape
    try:
        out = model.logits(torch.zeros(1, 3, height, width, dtype=torch.uint8))
    except Exception as e:  # noqa: BLE001 - whatever the runtime says of an input it does not take
        raise ModelFileError(f"{model.source}: does not take the {width}x{height} images {sidecar.name} names "
                             f"({first_line(e)})") from e
    if tuple(out.shape) != (1, len(model.classes)):
        raise ModelFileError(f"{model.source}: gives {tuple(out.shape)[1:] or out.shape} outputs an image, and "
                             f"{sidecar.name} names {len(model.classes)} classes")
    if not torch.isfinite(out).all():
        raise ModelFileError(f"{model.source}: gives non-finite outputs (nan or inf): the file is damaged")


def _load_export(export: Path, fmt: str, meta: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """The export as images -> logits, by its format's own loader (trainer/deploy/formats/), once its bytes are
    the container its sidecar's format is written in (a sidecar cannot make a .pt2 load as anything else)."""
    if fmt not in EXPORT_FORMATS:
        raise ModelFileError(f"{export}.json: unknown format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    check_format_file(export, fmt, Path(f"{export}.json"))
    return formats.part(fmt, "load")(export, meta)


@dataclass
class Classified:
    """The logits of the files that could be read (in input order), and why each other file could not."""

    paths: list[str]
    logits: torch.Tensor  # (len(paths), classes) float32 on the CPU
    kept: list[int]  # the input index of each row of `logits`
    errors: dict[int, str]  # input index -> "cannot read image (...)"


def classify(model: LoadedModel, paths: Sequence[str], batch: int = BATCH) -> Classified:
    """Classify image files in batches; a file that cannot be decoded is listed in `errors`, the others go on."""
    out_paths, logits, kept, errors = [], [], [], {}
    for start in range(0, len(paths), batch):
        images = []
        for i, path in enumerate(paths[start:start + batch], start=start):
            try:
                images.append(model.preprocess.decode(str(path)))
            except Exception as e:  # noqa: BLE001 - unreadable, truncated, not an image, a bomb: name the file
                errors[i] = f"cannot read image ({first_line(e)})"
                continue
            out_paths.append(str(path))
            kept.append(i)
        if images:
            logits.append(model.logits(torch.stack(images)).cpu())
    n = len(model.classes)
    return Classified(out_paths, torch.cat(logits) if logits else torch.zeros(0, n), kept, errors)
