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


def positional(default: Any = dataclasses.MISSING, help: str = "", *, default_factory: Any = dataclasses.MISSING,  # noqa: A002
               **argparse_extra) -> Any:
    """A field given on the command line by its place."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"help": help, **argparse_extra})
    return field(default=default, metadata={"help": help, **argparse_extra})


def _text(value: Any) -> str:
    """A value as its command line carries it: a float exactly (repr: 0.00123456789, 1e-06), anything else as text."""
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True, kw_only=True)
class Command:
    NAME: ClassVar[str]
    HELP: ClassVar[str]

    def argv(self) -> list[str]:
        """`main.py`'s arguments for this command (without `python main.py`): the positionals in order, then each
        option that differs from its default (a value starting with '-' joined to its flag, as argparse needs)."""
        places, options = [self.NAME], []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = f.metadata.get("flag")
            if value is None or value is False or value == "" or value == [] or value == f.default:
                continue
            if flag is None:
                places += [_text(v) for v in value] if isinstance(value, (list, tuple)) else [_text(value)]
            elif value is True:
                options.append(flag)
            elif isinstance(value, (list, tuple)) and f.metadata.get("action") == "append":
                options += [f"{flag}={_text(v)}" for v in value]
            elif isinstance(value, (list, tuple)):
                options += [flag, *map(_text, value)]
            else:
                options += [f"{flag}={_text(value)}"] if _text(value).startswith("-") else [flag, _text(value)]
        return places + options

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Command:
        """The request that `main.py`'s parser read (`args`, parsed by `add_parser`'s parser)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def add_parser(cls, sub) -> argparse.ArgumentParser:
        """This command's parser among `sub` (argparse's subparsers), from the fields."""
        parser = sub.add_parser(cls.NAME, help=cls.HELP)
        hints = typing.get_type_hints(cls)
        groups: dict[str, Any] = {}  # options of which one at most is given (--run-dir or --runs-dir)
        for f in dataclasses.fields(cls):
            extra = {k: v for k, v in f.metadata.items() if k not in ("flag", "group")}
            if callable(extra.get("choices")):  # asked when the parser is built (the export formats registered now)
                extra["choices"] = extra["choices"]()
            group = f.metadata.get("group")
            if group and group not in groups:
                groups[group] = parser.add_mutually_exclusive_group()
            where = groups[group] if group else parser
            kind = hints[f.name]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = [] if f.default_factory is not dataclasses.MISSING else f.default
            flag = f.metadata.get("flag")
            if kind is bool:
                where.add_argument(flag, dest=f.name, action="store_true", **extra)
                continue
            element, many = _element(kind)
            if many and extra.get("action") != "append":
                extra.setdefault("nargs", "+")
            if flag is None:
                if not required and not many:
                    extra.setdefault("nargs", "?")
                where.add_argument(f.name, type=element, default=None if required else default, **extra)
            else:
                where.add_argument(flag, dest=f.name, type=element, default=None if required else default,
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
                         "torchscript is deprecated", choices=lambda: tuple(EXPORT_FORMATS))  # as registered now
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


def overrides(help: str = "override config keys") -> Any:  # noqa: A002
    """`--set KEY=VALUE ...`: config keys set on the command line, given once or more."""
    return field(default_factory=list, metadata={"flag": "--set", "metavar": "KEY=VALUE", "action": "extend",
                                                 "help": help})


# ---- runs -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Train(Command):
    NAME = "train"
    HELP = "train headless from a YAML config"
    config: str = positional()
    set: list[str] = overrides()
    run_dir: str | None = option("--run-dir", None, "use this run directory", group="where")
    runs_dir: str | None = option("--runs-dir", None, "create the run directory under this folder (default ./runs)",
                                  group="where")
    overwrite: bool = option("--overwrite", False, "with --run-dir: replace a run already there (its checkpoints and "
                             "events are removed)")
    output_log: str | None = option("--output-log", None, "the file this command's output is sent to (the app's "
                                    "launch): moved into the run directory as output.log once it exists")
    host: str | None = option("--host", None, "train on this host (main.py hosts; the same as --set "
                              "device.host=NAME)")
    resumable: bool = option("--resumable", False, "with --run-dir: a job started again (a requeued SLURM job) finds "
                             "its run there and goes on from its last checkpoint; one that completed is left as it is")
    detach: bool = option("--detach", False, "a run on a host (device.host): return once it has started there; follow "
                          "it later with main.py mirror RUN_DIR")
    auto_choices: str | None = option("--auto-choices", None, "Auto's choices for this config (the JSON of `main.py "
                                      "auto --plan-only`), kept in the run as auto.json")


@dataclass(frozen=True, kw_only=True)
class Resume(Command):
    NAME = "resume"
    HELP = "continue a stopped, failed or killed run from its last good checkpoint"
    run_dir: str = positional()
    force: bool = option("--force", False, "also resume a completed run")
    epochs: int | None = option("--epochs", None, "extend the run (completed or early-stopped included) to this many "
                                "epochs in all; the schedule rule is in docs/config.md", metavar="TOTAL")


@dataclass(frozen=True, kw_only=True)
class Auto(Command):
    NAME = "auto"
    HELP = ("from an ImageFolder and a time budget to a trained, evaluated and exported model, every choice printed "
            "with its reason")
    folder: str = positional(help="an ImageFolder (one sub-folder per class), or a folder with train/ and test/ (or "
                             "val/) in it")
    minutes: float = option("--minutes", dataclasses.MISSING, "the whole budget: planning, training, the test set and "
                            "the export")
    set: list[str] = overrides("override what Auto chose")
    labels: str | None = option("--labels", None, "multi-label: the labels file of the folder's images "
                                "(file,labels); Auto plans a multi-label run, by mAP")
    run_dir: str | None = option("--run-dir", None, "use this run directory", group="where")
    runs_dir: str | None = option("--runs-dir", None, "create the run directory under this folder (default ./runs)",
                                  group="where")
    plan_only: bool = option("--plan-only", False, "print the plan as JSON (config, choices, probes) without training; "
                             "the app starts it as a run. With a SLURM --host, the plan is made inside the job: the "
                             "answer says so ({\"in_job\": true}) and `auto --host` without --plan-only runs it")
    host: str | None = option("--host", None, "plan and train on this host (main.py hosts): the scan, the speed probe "
                              "and the learning-rate sweep run there, on its devices")
    output_log: str | None = option("--output-log", None, "as for train")
    download_weights: bool = option("--download-weights", False, "when the images look like photographs and no "
                                    "pretrained weights are cached, download the ImageNet weights Auto offers first "
                                    "(their time is not the budget's) and plan with them; offline, say so and plan "
                                    "from scratch")


@dataclass(frozen=True, kw_only=True)
class Queue(Command):
    NAME = "queue"
    HELP = "the run queue: add, list, run (the scheduler), hold, release, move, remove, retry"
    action: str = positional(choices=("add", "list", "run", "hold", "release", "move", "remove", "retry"))
    target: str | None = positional(None, "add: the config file; hold/release/move/remove/retry: the run directory")
    set: list[str] = overrides("add: override config keys")
    runs_dir: str | None = option("--runs-dir", None, "the runs directory whose queue this is (default ./runs)")
    until_empty: bool = option("--until-empty", False, "run: stop once nothing is waiting or running")
    cpu_runs: int = option("--cpu-runs", 1, "run: CPU runs at a time (default 1)")
    to: int = option("--to", 0, "move: the new place in the queue (0 = next)")


@dataclass(frozen=True, kw_only=True)
class Sweep(Command):
    NAME = "sweep"
    HELP = "queue the runs of a sweep file (grid, random; optuna with pruning)"
    sweep: str = positional()
    runs_dir: str | None = option("--runs-dir", None, "the runs directory whose queue gets the trials (default ./runs)")


# ---- remote runs ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Hosts(Command):
    NAME = "hosts"
    HELP = "the hosts remote runs go to (SSH or SLURM through a login node): list, add, remove, check"
    action: str = positional(choices=("list", "add", "remove", "check"))
    name: str | None = positional(None)
    ssh: str | None = option("--ssh", None, "add: the SSH destination (an alias of ~/.ssh/config, user@host)")
    command: str | None = option("--command", None, "add: TrainDeck there, e.g. '~/traindeck/.venv/bin/python "
                                 "~/traindeck/main.py'")
    runs: str | None = option("--runs", None, "add: the runs folder there (default ~/traindeck-runs)")
    scheduler: str = option("--scheduler", "ssh", "add: slurm when it is a login node", choices=("ssh", "slurm"))
    partition: str | None = option("--partition", None, "add: the SLURM partition (default: the cluster's default)")
    ssh_option: list[str] | None = option("--ssh-option", None, "add: one more ssh argument (repeat)",
                                          action="append")
    json: bool = option("--json", False)


@dataclass(frozen=True, kw_only=True)
class Agent(Command):
    NAME = "agent"
    HELP = "the host side of remote runs (run over SSH by the app; docs/remote.md)"
    action: str = positional(choices=("version", "ls", "scan", "start", "resume", "submit", "submit-auto", "follow",
                                      "stop", "send", "pack"))
    host: str | None = option("--host", None, "ls, scan: on this host (main.py hosts)")
    agent_args: list[str] = positional(default_factory=list, nargs="*")
    runs: str | None = option("--runs", None)
    name: str | None = option("--name", None)
    epochs: int | None = option("--epochs", None)
    minutes: float | None = option("--minutes", None, "submit-auto: Auto's budget, from the job's start")
    labels: str | None = option("--labels", None, "scan, submit-auto: multi-label, the labels file of the folder's "
                                "images")
    partition: str | None = option("--partition", None)
    cpus_per_task: int | None = option("--cpus-per-task", None)
    offset: list[str] = field(default_factory=list, metadata={"flag": "--offset", "action": "append", "help": ""})
    job: int | None = option("--job", None)
    job_output: str | None = option("--job-output", None)
    kill: bool = option("--kill", False)
    thumbs: int = option("--thumbs", 6)
    thumb_size: int = option("--thumb-size", 56)


@dataclass(frozen=True, kw_only=True)
class Mirror(Command):
    NAME = "mirror"
    HELP = "follow a remote run into its local mirror until it ends (re-attach)"
    run_dir: str = positional()


@dataclass(frozen=True, kw_only=True)
class Fetch(Command):
    NAME = "fetch"
    HELP = "bring one file of a remote run (a checkpoint, an export) into its mirror"
    run_dir: str = positional()
    file: str = positional(help="relative to the run directory, e.g. checkpoints/best.pt")


DECLARED = (Train, Resume, Auto, Queue, Sweep, Hosts, Agent, Mirror, Fetch, DescribeModel, ProbeDevices, GradCam,
            Predict, LrFind, AugmentPreview, Audit, Label, Export, FetchWeights, Summarize, Standby, Resident)
