"""The trainer's commands that the app runs, each declared once: a frozen dataclass whose fields are the command's
arguments. `main.py`'s parser for the command is built from it (`add_parser`), and so is the command line a client
runs (`argv()`): a flag cannot be spelled one way in the CLI and another in the app. Torch-free.

A field is positional unless its metadata gives a flag (`option("--out")`); a bool field is a switch; a list field
takes one or more values; a field with no default is required. Help texts live beside the fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainer.core.catalog import CALIBRATION_IMAGES, DEFAULT_EXPORT_FORMAT, EXPORT_FORMATS, INT8_METHODS, RUN_CHECKPOINTS


def option(flag: str, default: Any = None, help: str = "", **argparse_extra) -> Any:  # noqa: A002 - argparse's word
    """A field given on the command line as `flag VALUE` (a switch for a bool field)."""
    return field(default=default, metadata={"flag": flag, "help": help, **argparse_extra})


def positional(default: Any = dataclasses.MISSING, help: str = "", **argparse_extra) -> Any:  # noqa: A002
    return field(default=default, metadata={"help": help, **argparse_extra})


def _text(value: Any) -> str:
    """A value as its command line carries it: a float exactly (repr: 0.00123456789, 1e-06), anything else as text."""
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True, kw_only=True)
class Command:
    NAME: ClassVar[str]
    HELP: ClassVar[str]

    def argv(self) -> list[str]:
        """`main.py`'s arguments for this command (without `python main.py`)."""
        out = [self.NAME]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = f.metadata.get("flag")
            if value is None or value == "" or value is False or value == []:
                continue
            if flag is None:
                out += [_text(v) for v in value] if isinstance(value, (list, tuple)) else [_text(value)]
            elif value is True:
                out.append(flag)
            elif isinstance(value, (list, tuple)):
                out += [flag, *map(_text, value)]
            else:
                out += [flag, _text(value)]
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Command:
        """The request that `main.py`'s parser read (`args`, parsed by `add_parser`'s parser)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def add_parser(cls, sub) -> argparse.ArgumentParser:
        """This command's parser among `sub` (argparse's subparsers), from the fields."""
        parser = sub.add_parser(cls.NAME, help=cls.HELP)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            extra = {k: v for k, v in f.metadata.items() if k != "flag"}
            kind = hints[f.name]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = [] if f.default_factory is not dataclasses.MISSING else f.default
            flag = f.metadata.get("flag")
            if kind is bool:
                parser.add_argument(flag, dest=f.name, action="store_true", **extra)
                continue
            element, many = _element(kind)
            if many:
                extra.setdefault("nargs", "+")
            if flag is None:
                if not required and not many:
                    extra.setdefault("nargs", "?")
                parser.add_argument(f.name, type=element, default=None if required else default, **extra)
            else:
                parser.add_argument(flag, dest=f.name, type=element, default=None if required else default,
                                    required=required, **extra)
        return parser


def _element(kind: Any) -> tuple[type, bool]:
    """The type of one value of a field's type (str for `str | None`), and whether the field holds a list."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is list:
        return args[0], True
    if args:  # X | None
        return _element(args[0])
    return kind, False


# ---- the app's questions ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DescribeModel(Command):
    NAME = "describe-model"
    HELP = "JSON list of a model's parameter tensors"
    name: str = positional("small_cnn", "a model: built-in, torchvision, timm:NAME or FILE.py:CLASS")
    classes: int = option("--classes", 10, "outputs of the classifier head")
    weights: str | None = option("--weights", None, "the weights whose normalisation to report (a name the model "
                                 "offers)")
    list: bool = option("--list", False, "list torchvision classifiers instead")
    store: bool = option("--store", False, "the model store: every torchvision classifier with its published figures "
                         "and whether its weights are cached")


@dataclass(frozen=True, kw_only=True)
class ProbeDevices(Command):
    NAME = "probe-devices"
    HELP = "JSON of GPUs and distributed backends available here"
    host: str | None = option("--host", None, "probe this host instead (main.py hosts)")


@dataclass(frozen=True, kw_only=True)
class GradCam(Command):
    NAME = "grad-cam"
    HELP = "Grad-CAM overlay: where a run's network sees the evidence in an image"
    run_dir: str = positional()
    image: str = positional()
    out: str = option("--out", dataclasses.MISSING, "the overlay PNG to write")
    checkpoint: str = option("--checkpoint", "best", choices=RUN_CHECKPOINTS)
    cls: str | None = option("--class", None, "explain this class (default: the predicted one)")


@dataclass(frozen=True, kw_only=True)
class Predict(Command):
    NAME = "predict"
    HELP = "classify images with a run's checkpoint or an exported model"
    model: str = positional(help="a run directory or an exported model file (with its .json beside it)")
    images: list[str] = positional(help="image files or folders of them")
    top: int = option("--top", 1, "print this many classes per image, best first")
    checkpoint: str = option("--checkpoint", "best", "with a run directory", choices=RUN_CHECKPOINTS)
    json: bool = option("--json", False, "print the results as JSON")


@dataclass(frozen=True, kw_only=True)
class LrFind(Command):
    NAME = "lr-find"
    HELP = "sweep the learning rate and suggest one"
    config: str = positional()
    set: list[str] = field(default_factory=list, metadata={"flag": "--set", "metavar": "KEY=VALUE",
                                                          "action": "extend", "help": "config overrides"})
    steps: int = option("--steps", 200)
    start: float = option("--start", 1e-6)
    end: float = option("--end", 10.0)
    json: bool = option("--json", False, "print the whole curve as JSON")
    write: bool = option("--write", False, "write the suggestion into the config file")


@dataclass(frozen=True, kw_only=True)
class AugmentPreview(Command):
    NAME = "augment-preview"
    HELP = ("a few training images as the network sees them: decoded, then in several random draws of data.augment, "
            "written as PNG files")
    config: str = positional()
    out: str = option("--out", dataclasses.MISSING, "folder for the PNG files (created)")
    set: list[str] = field(default_factory=list, metadata={"flag": "--set", "metavar": "KEY=VALUE",
                                                          "action": "extend", "help": "config overrides"})
    images: int = option("--images", 4, "how many training images (one of each class first)")
    draws: int = option("--draws", 4, "augmented versions of each")
    seed: int = option("--seed", 0, "which images and which draws")
    json: bool = option("--json", False, "print what was drawn as JSON")


@dataclass(frozen=True, kw_only=True)
class Audit(Command):
    NAME = "audit"
    HELP = ("find the run's images that are probably labelled wrong (cleanlab's confident learning on out-of-sample "
            "probabilities), most likely first; copies (exact, resized, recompressed) and leaks across train/val/test; "
            "and the images far from every other")
    run_dir: str = positional()
    folds: int | None = option("--folds", None, "folds of the cross-fitted linear probe (default 5; 10 for a "
                               "multi-label run)")
    top: int = option("--top", 20, "suspects printed (all are in RUN/audit/label_issues.csv)")
    json: bool = option("--json", False, "every suspect as JSON")
    oof: str = option("--oof", "probe", "the out-of-sample probabilities: a cross-fitted linear probe on the run's "
                      "embeddings (seconds; default), or --folds training runs with the run's recipe, each without "
                      "one fold (costs that many runs; kept under RUN/audit/folds/)", choices=("probe", "runs"))
    map: bool = option("--map", False, "also a 2-D map of the images (UMAP, else t-SNE, of the embeddings): "
                       "RUN/audit/map.csv")


@dataclass(frozen=True, kw_only=True)
class Label(Command):
    NAME = "label"
    HELP = ("order a pool of unlabelled images by what the run's network is least sure of (with no two near-copies at "
            "the top): the images to label next")
    run_dir: str = positional()
    pool: str = option("--pool", dataclasses.MISSING, "a folder of unlabelled images (any depth)")
    next: int = option("--next", 20, "how many to list (default 20)")
    manifest: str | None = option("--manifest", None, "the manifest the labels go to (default: the run's "
                                  "data.exclude); images already added there are set aside")
    json: bool = option("--json", False, "the list as JSON")


@dataclass(frozen=True, kw_only=True)
class Export(Command):
    NAME = "export"
    HELP = "export a run's checkpoint for other tools"
    run_dir: str = positional()
    format: str = option("--format", DEFAULT_EXPORT_FORMAT, f"default {DEFAULT_EXPORT_FORMAT} (torch.export); "
                         "torchscript is deprecated", choices=tuple(EXPORT_FORMATS))
    out: str = option("--out", dataclasses.MISSING)
    checkpoint: str = option("--checkpoint", "best", choices=RUN_CHECKPOINTS)
    int8: str = option("--int8", "auto", "onnx_int8: static (calibrated; auto picks it for networks with "
                       "convolutions) or dynamic", choices=INT8_METHODS)
    calibration: str | None = option("--calibration", None, "onnx_int8: calibrate on the images in this folder (any "
                                     "depth; on the host for a remote run) instead of a sample of the run's training "
                                     "split", metavar="FOLDER")
    calibration_images: int = option("--calibration-images", CALIBRATION_IMAGES, "onnx_int8: how many images to "
                                     f"calibrate on, chosen with the run's seed (default {CALIBRATION_IMAGES})",
                                     metavar="N")


@dataclass(frozen=True, kw_only=True)
class FetchWeights(Command):
    NAME = "fetch-weights"
    HELP = "download a model's pretrained weights into the cache (for offline use)"
    model: str = positional(help="a torchvision classifier (resnet50, ...) or timm:NAME")
    weights: str = positional("DEFAULT", "a name the model offers (default: DEFAULT)")


@dataclass(frozen=True, kw_only=True)
class Summarize(Command):
    NAME = "summarize"
    HELP = "build or update RUN_DIR's events summary (what opening a long run reads); JSON on stdout"
    run_dir: str = positional()


@dataclass(frozen=True, kw_only=True)
class Standby(Command):
    NAME = "standby"
    HELP = ("import what a run needs, then run the train/resume command read from stdin (JSON: argv, output); the app "
            "keeps one ready so Start is quicker")


@dataclass(frozen=True, kw_only=True)
class Resident(Command):
    NAME = "resident"
    HELP = ("the app's resident worker: answer describe-model, probe-devices, grad-cam, predict, lr-find and "
            "augment-preview requests read from stdin (JSON lines) with torch imported once")


DECLARED = (DescribeModel, ProbeDevices, GradCam, Predict, LrFind, AugmentPreview, Audit, Label, Export, FetchWeights,
            Summarize, Standby, Resident)
