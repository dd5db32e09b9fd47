"""The run configuration: one typed, validated object, loaded from and saved to YAML.

Torch-free: the desktop app imports this module to build and check configs.
Every key is declared once here, with its default, its allowed values and a one-line description; the
validation messages, `docs/config.md` and the app's forms all come from these declarations.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.core.catalog import EXPORT_FORMATS
from trainer.core.errors import InputError
from trainer.core.files import UserFileError, atomic_write_text
from trainer.core.user_yaml import MAX_CONFIG_BYTES, YamlError, parse_yaml, read_yaml_file, shown

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "databricks")  # the tracking stores MLflow runs
MAX_MLFLOW_NAME = 500  # an experiment's name (MLflow keeps names far shorter than the 100,000 characters tried)
MAX_SEED = 2**32 - 1  # numpy seeds are 32-bit; the loop derives per-epoch seeds from it
# Numbers YAML 1.1 leaves as strings but users write as numbers: 3e-4, 1E12, .5, 1_000.
_FLOAT_TEXT = re.compile(r"[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][-+]?\d+)?")


def parse_float(value: Any) -> float:
    """A number as users write it (3e-4 arrives from YAML as a string); ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a number")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
        return float(value.strip().replace("_", ""))
    raise ValueError(f"{shown(value)} is not a number")


class ConfigError(InputError, ValueError):
    """One or more invalid keys; each message starts with the key path it concerns."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems))


def opt(default: Any = None, doc: str = "", *, choices: tuple | None = None, ge: float | None = None,
        gt: float | None = None, le: float | None = None, lt: float | None = None, factory: Any = None,
        step: float | None = None, lowest: str | None = None):
    """A config key: its default, a one-line description and the values it allows; for a form, the `step` a number
    moves by and what its `lowest` value means, in a word ("auto", "off")."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "step": step, "lowest": lowest}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class AugmentConfig:
    hflip: bool | str = opt("auto", "random horizontal flip: true, false, or auto = on unless mirror images change the "
                            "class (the class names look like characters or name mirror pairs such as left and right, "
                            "or in a sample of the images mirrored classes look like other classes); the trainer "
                            "decides and run_start says why", choices=("auto", True, False))
    random_resized_crop: bool = opt(True, "random crop of part of the image, resized back to image_size")
    crop_scale_min: float | str = opt("auto", "smallest crop area, as a fraction of the image; auto = 0.8 for a "
                                      "multi-label run (a smaller crop can cut a labelled thing out of the image, and "
                                      "its label with it) or for classes that look like characters (a smaller crop "
                                      "cuts strokes off), else 0.6", gt=0, le=1, step=0.05,
                                      lowest="auto")
    color_jitter: float = opt(0.0, "strength of random brightness/contrast/saturation changes (0 = off)",
                              ge=0, le=1, step=0.05)
    policy: str = opt("none", "an automatic augmentation policy applied to each image after the crop and flip "
                      "(torchvision's): trivial_augment (one random operation of random strength each) or "
                      "rand_augment (two of strength 9); none = off",
                      choices=("none", "trivial_augment", "rand_augment"))
    random_erasing: float = opt(0.0, "share of the images in which a random rectangle (2-33% of the image) is "
                                "painted over with the image's mean colour (0 = off)", ge=0, le=1,
                                step=0.05)
    mixup: float = opt(0.0, "MixUp: each batch blended with itself in another order, labels blended alike; the "
                       "blend drawn from Beta(mixup, mixup), typically 0.2-0.4 (0 = off)", ge=0, le=10,
                       step=0.1)
    cutmix: float = opt(0.0, "CutMix: a rectangle of another image of the batch pasted in, labels mixed by its "
                        "area; the area drawn from Beta(cutmix, cutmix), typically 1.0 (0 = off; with mixup on too, "
                        "each batch is one or the other)", ge=0, le=10, step=0.1)
    albumentations: list[dict] | None = opt(None, "your own per-image pipeline, run on each training image before "
                                            "the crop and flip: a list of Albumentations transforms, each written "
                                            "TransformName: {argument: value} (pip install albumentations); the "
                                            "images must keep their size")


@dataclass
class DataConfig:
    train_dir: str = opt("", "ImageFolder directory: one sub-folder per class")
    val_dir: str | None = opt(None, "optional validation ImageFolder; else val_split of train is held out")
    test_dir: str | None = opt(None, "optional test ImageFolder: evaluated once at the end with best.pt (eval/test/)")
    test_split: float = opt(0.0, "without data.test_dir: fraction of train held out as the test set (stratified, "
                            "seeded; never trained or validated on; evaluated once at the end with best.pt, "
                            "eval/test/); the files stay where they are (0 = none)", ge=0, lt=1)
    val_split: float = opt(0.2, "fraction of train held out for validation (stratified, seeded)", gt=0, lt=1,
                            step=0.05)
    image_size: int = opt(32, "side of the square images fed to the model, in pixels (their height when "
                          "data.image_width is set)", ge=8, le=1024)
    image_width: int = opt(0, "width of the images fed to the model when it differs from their height, in pixels "
                           "(0 = square: data.image_size)", ge=0, le=1024, lowest="square")
    resize: str = opt("crop", "how an image of another shape becomes image_size: crop (short side to fit, centre crop) "
                      "or pad (whole image, long side to fit, centred on black)", choices=("crop", "pad"))
    batch_size: int = opt(64, "images per step per process", ge=1, le=65536)
    num_workers: int = opt(-1, "data-loading worker processes (-1 = from the core count)", ge=-1, le=64,
                          lowest="auto")
    augment: AugmentConfig = opt(factory=AugmentConfig, doc="training-time augmentation")
    mean: list[float] | str = opt("auto", "per-channel normalisation mean (RGB); auto = the pretrained weights' own, "
                                  "ImageNet's without named weights")
    std: list[float] | str = opt("auto", "per-channel normalisation std (RGB); auto as for mean")
    cache: str = opt("auto", "decoded-image cache, built once and reused by later runs: memory (read into RAM), "
                     "disk (memory-mapped), none (decode every epoch); auto = memory when it fits in a quarter "
                     "of free RAM, else disk", choices=("auto", "none", "memory", "disk"))
    cache_dir: str | None = opt(None, "where decoded images are kept (default: ~/.cache/traindeck/images, or "
                                "$XDG_CACHE_HOME/traindeck/images)")
    gpu_cache: bool = opt(True, "on a GPU, keep the in-memory cache in GPU memory when it fits in a quarter of the "
                          "free memory (batches are then taken on the GPU, no copies); false: copy each batch from "
                          "pinned host memory, one batch ahead")
    sampler: str = opt("shuffle", "training order: shuffle (each image once per epoch) or balanced (images drawn "
                       "with replacement so every class is seen equally often)", choices=("shuffle", "balanced"))
    exclude: str | None = opt(None, "dataset manifest (YAML): images left out or relabelled, written from the "
                              "Results tab; the image files themselves are never touched")
    on_bad_file: str = opt("skip", "unreadable images: skip (listed in the log) or fail the run",
                           choices=("skip", "fail"))
    labels: str | None = opt(None, "multi-label: a labels file (CSV: file,labels with ; between an image's labels, "
                             "or file,LABEL1,LABEL2,... one-hot) listing the images of data.train_dir; set, the run "
                             "is multi-label (loss.name bce)")
    val_labels: str | None = opt(None, "multi-label: a labels file of validation images; else val_split of "
                                 "data.labels' images is held out")
    test_labels: str | None = opt(None, "multi-label: a labels file of test images, evaluated once at the end with "
                                  "best.pt (eval/test/)")


@dataclass
class ModelConfig:
    name: str = opt("small_cnn", "small_cnn, resnet9, resnet10t, any torchvision classifier (resnet18, ...) or "
                               "path/file.py:ClassName")
    weights: str | None = opt(None, "pretrained weights: a name the model offers (DEFAULT, IMAGENET1K_V1, ...; fetched "
                              "into the torch hub cache, or the Hugging Face cache for timm:), or a local .safetensors / "
                              ".pt state_dict file; none when empty")
    freeze_backbone: bool = opt(False, "linear probe: train the classifier head only; the backbone's weights and "
                                "BatchNorm statistics stay as loaded")
    unfreeze_at_epoch: int = opt(0, "gradual unfreezing: keep the backbone frozen for this many epochs, then train it "
                                 "too (0 = off)", ge=0, lowest="never frozen")
    init: str = opt("default", "parameter initialisation applied with net.apply",
                    choices=("default", "xavier_uniform", "xavier_normal", "kaiming_normal", "normal", "constant"))


@dataclass
class LossConfig:
    name: str = opt("cross_entropy", "loss function (multi-label runs: bce, binary cross-entropy per label; or asl, "
                    "the asymmetric loss: easy negatives count for little)",
                    choices=("cross_entropy", "nll", "mse", "multi_margin", "bce", "asl"))
    label_smoothing: float = opt(0.0, "label smoothing (cross_entropy; bce: targets eps/2 and 1 - eps/2)", ge=0, lt=1,
                                step=0.05)
    class_weights: str = opt("none", "weight each class's loss: auto = inverse class frequency in the training set, "
                             "normalised to a mean of 1 (for unbalanced classes); with bce, each label's positives "
                             "weighted by its negatives over its positives (rare labels)", choices=("none", "auto"))


@dataclass
class ParamGroupConfig:
    pattern: str = opt("", "module-name pattern (fnmatch): 'fc', 'layer4.*', 'features.0'")
    lr: float | None = opt(None, "learning rate of this group (default: optimizer.lr)", gt=0)
    weight_decay: float | None = opt(None, "weight decay of this group (default: optimizer.weight_decay)", ge=0)
    momentum: float | None = opt(None, "momentum of this group (sgd/nesterov/rmsprop)", ge=0, lt=1)
    freeze: bool = opt(False, "freeze the matched parameters (requires_grad = False)")


@dataclass
class OptimizerConfig:
    name: str = opt("sgd", "optimizer", choices=("sgd", "nesterov", "adam", "adamw", "rmsprop", "adagrad"))
    lr: float = opt(0.05, "base learning rate", gt=0, le=100)
    momentum: float = opt(0.9, "momentum (sgd, nesterov, rmsprop)", ge=0, lt=1)
    weight_decay: float = opt(5e-4, "L2 weight decay", ge=0)
    norm_weight_decay: float | None = opt(0.0, "weight decay of normalisation-layer weights and biases (every "
                                          "one-dimensional parameter), as torchvision's --norm-weight-decay and "
                                          "timm exclude them; null = weight_decay for them too", ge=0)
    groups: list[ParamGroupConfig] = opt(factory=list, doc="parameter groups with their own settings")


@dataclass
class SchedulerConfig:
    name: str = opt("cosine", "learning-rate schedule",
                    choices=("none", "step", "multistep", "cosine", "onecycle", "exponential"))
    warmup_epochs: float = opt(0.0, "linear warm-up from 0 over this many epochs", ge=0, step=0.5)
    step_size: int = opt(10, "step: epochs between decays", ge=1)
    milestones: list[int] = opt(factory=lambda: [30, 60], doc="multistep: epochs at which lr decays")
    gamma: float = opt(0.1, "decay factor (step, multistep, exponential per epoch)", gt=0, le=1)


@dataclass
class EarlyStopConfig:
    metric: str = opt("val_loss", "the validation metric watched (val_map: multi-label runs' mean average "
                      "precision)", choices=("val_acc", "val_loss", "val_map"))
    patience: int = opt(0, "stop after this many epochs without improvement (0 = off)", ge=0, le=100000)
    min_delta: float = opt(0.0, "smallest change that counts as an improvement", ge=0)
    share: float = opt(0.0, "with patience on: wait at least this share of train.epochs as it stands (re-planned "
                       "epochs included, train.replan), so a run re-planned longer also waits longer; Auto uses a "
                       "third (0 = patience alone)", ge=0, le=1)


@dataclass
class TrainConfig:
    epochs: int = opt(10, "passes over the training set", ge=1, le=100000)
    budget: float = opt(0.0, "time budget in minutes from the trainer's start (preparing the data included; a "
                        "resumed run spends what its earlier segments left, and `resume --epochs` lifts it): no "
                        "epoch is begun that would end past it, judged by the last epoch's time, and at the first step "
                        "past it (across ranks: the first log step) the epoch is cut short, validated and the run "
                        "ends completed; the test set and exports come after it unless train.finish_images keeps "
                        "time for them (0 = none)", ge=0)
    replan: bool = opt(False, "with train.budget: after each epoch, re-plan train.epochs from the epoch time measured "
                       "so far (the median, the first epoch's warm-up left out) so the run ends inside the budget, "
                       "with the learning-rate schedule re-stretched to end its annealing there (a `replan` event "
                       "says old -> new and why; Auto turns it on)")
    finish_images: int = opt(0, "with train.budget: the budget also covers what comes after training (the test set, "
                             "the exports): training ends the time this many validation images take before it, at "
                             "the validation speed the run measures (so a machine that slows down keeps the total); "
                             "Auto sets it from its prediction of the test set and the export (0 = the budget is "
                             "training's alone)", ge=0, le=10**9)
    min_epochs: int = opt(0, "with train.replan: when the first epoch shows that fewer epochs than this fit in the "
                          "budget, the run ends after it (completed, reason too_slow) instead of training too few; "
                          "Auto sets it when a faster network is left to go on with (0 = off)", ge=0, le=100000)
    recheck_epochs: int = opt(0, "with train.replan: when the first epoch shows that at least this many epochs fit in "
                              "the budget, the run ends after it (completed, reason too_fast) so that the candidate "
                              "networks can be measured again; Auto sets it when the machine was busy while it "
                              "measured (0 = off)", ge=0, le=100000)
    grad_accum_steps: int = opt(1, "micro-batches accumulated per optimizer step", ge=1, le=1024)
    clip_grad_norm: float | None = opt(None, "clip the global gradient norm to this value", gt=0)
    progressive_resize: float = opt(0.0, "progressive resizing: train the first epochs at this fraction of "
                                    "data.image_size, growing to the full size by 3/4 of the epochs (cheaper early "
                                    "epochs; validation always at the full size; 0 = off)", ge=0, lt=1)
    ema: float = opt(0.0, "moving average of the weights: its decay per optimizer step (0.999 averages about the last "
                     "1000 steps; 0 = off); the averaged weights are validated, checkpointed as the model and "
                     "exported", ge=0, lt=1)
    seed: int = opt(0, "seed for data order, augmentation and initialisation", ge=0, le=MAX_SEED)
    amp: str = opt("auto", "mixed precision: auto = bf16 autocast where the hardware runs it natively (GPUs with bf16, "
                   "CPUs with AVX512-BF16 or AMX), else fp32; none = fp32; bf16 / fp16 (+ GradScaler) when asked",
                   choices=("auto", "none", "bf16", "fp16"))
    memory_format: str = opt("auto", "activation and weight layout: auto = channels_last for the built-in and "
                             "torchvision models on a GPU or an AVX-512 CPU (their convolutions run faster in it), "
                             "contiguous on other CPUs and for your own models",
                             choices=("auto", "channels_last", "contiguous"))
    compile: bool = opt(False, "torch.compile the model: faster steps on some hardware after a slow first step "
                        "(on a 2-core CPU it was slower; see docs/benchmarks.md)")
    sync_batchnorm: bool = opt(False, "ddp: convert BatchNorm layers to SyncBatchNorm")
    on_nonfinite: str = opt("stop", "non-finite loss or gradient: stop the run, or skip the step",
                            choices=("stop", "skip"))
    early_stop: EarlyStopConfig = opt(factory=EarlyStopConfig, doc="end the run (completed) when the validation "
                                      "metric stops improving")


@dataclass
class EvalConfig:
    tta: bool = opt(False, "test-time augmentation: average the logits of each image and of its mirror image, in "
                    "validation, the test set, evaluate and predict, and inside exported graphs (ONNX, "
                    "exported_program, TorchScript, ExecuTorch, Core ML)")


@dataclass
class ExportConfig:
    formats: list[str] = opt(factory=list, doc="export best.pt in these formats when the run completes, into "
                             "RUN_DIR/exports/model.EXT with its model card (.json and .md) and measured "
                             "accuracy, size and speed (" + ", ".join(EXPORT_FORMATS) + ")",
                             choices=EXPORT_FORMATS)  # the registry itself: a format registered later is allowed too


@dataclass
class DeviceConfig:
    type: str = opt("cpu", "where to train: cpu, cuda (NVIDIA GPUs) or mps (Apple silicon's GPU)",
                    choices=("cpu", "cuda", "mps"))
    gpus: list[int] = opt(factory=lambda: [0], doc="GPU indices (cuda)")
    parallel: str = opt("none", "none (one device), dp (DataParallel) or ddp (DistributedDataParallel)",
                        choices=("none", "dp", "ddp"))
    launcher: str = opt("torchrun", "ddp launcher", choices=("torchrun", "spawn", "horovod"))
    nproc: int = opt(1, "ddp processes per node", ge=1, le=1024)
    backend: str = opt("auto", "ddp backend (auto: nccl on cuda, gloo on cpu)",
                       choices=("auto", "gloo", "nccl", "mpi"))
    init_method: str = opt("env", "ddp rendezvous: env (torchrun), tcp or file (spawn)",
                           choices=("env", "tcp", "file"))
    nnodes: int = opt(1, "machines taking part in a ddp run", ge=1, le=4096)
    node_rank: int = opt(0, "this machine's index among nnodes", ge=0)
    master_addr: str = opt("127.0.0.1", "address of node 0 (multi-node ddp)")
    master_port: int = opt(0, "rendezvous port (0 = pick a free one, single node only)", ge=0, le=65535,
                           lowest="pick a free one")
    timeout_s: int = opt(120, "seconds a rank waits for the others before giving up", ge=5)
    host: str = opt("", "where to run: empty for this machine, or a host of hosts.yaml (main.py hosts; SSH or SLURM "
                    "through it); its data paths are paths on that host")
    slurm_time_min: int = opt(0, "SLURM: the job's time limit in minutes (sbatch --time); 0 = train.budget and a "
                              "quarter more, or the partition's own limit when the run has no budget", ge=0,
                              le=525600)
    slurm_warning_s: int = opt(120, "SLURM: seconds before the time limit (or a preemption) at which SLURM warns the "
                               "trainer (SIGUSR1): it checkpoints at the next step, ends `preempted`, and the job "
                               "requeues itself; allow one step and one checkpoint", ge=10, le=3600)
    requeue_limit: int = opt(3, "SLURM: times a preempted job requeues itself to go on in the same run directory "
                             "(0 = never)", ge=0, le=100)
    max_restarts: int = opt(0, "torchrun: times the group of ranks starts again from the last checkpoint when one "
                            "of them dies (torchrun --max-restarts; 0 = a rank that dies ends the run)", ge=0, le=100)
    share_cpu: bool = opt(True, "one process on the CPU: every 5 s, fit torch's threads to the cores other programs "
                                "leave free (a thread sharing its core with another program slows every step), and "
                                "take them back when the others are gone; a warning says each change")


@dataclass
class MonitorConfig:
    log_every: int = opt(10, "steps between step events (and host syncs)", ge=1)
    grad_stats: bool = opt(True, "stream per-layer gradient statistics every log_every steps")
    histogram_every: int = opt(0, "steps between gradient/weight histograms (0 = off)", ge=0)
    histogram_layers: list[str] = opt(factory=list, doc="layers to histogram (patterns; empty = first and last)")
    histogram_bins: int = opt(32, "bins per histogram", ge=4, le=1024)
    loss_spike_factor: float = opt(3.0, "warn when the logged loss exceeds this multiple of its running mean", gt=1)
    grad_explode: float = opt(1e4, "warn when the global gradient norm exceeds this", gt=0)
    grad_vanish: float = opt(1e-8, "warn when the global gradient norm falls below this", ge=0)
    system_every_s: float = opt(2.0, "seconds between system (CPU/memory/GPU) samples", gt=0)
    tensorboard: bool = opt(False, "also write TensorBoard event files into the run directory (scalars, histograms, "
                            "hparams; needs the tensorboard package)")
    mlflow: str | None = opt(None, "also log the run to MLflow: a tracking URI (http://127.0.0.1:5000, "
                             "sqlite:///path/mlflow.db, postgresql://, mysql://, databricks), or env for "
                             "MLFLOW_TRACKING_URI; "
                             "empty = off (needs the mlflow package)")
    mlflow_experiment: str = opt("traindeck", "the MLflow experiment the run is logged under")


@dataclass
class CheckpointConfig:
    every_epochs: int = opt(1, "epochs between checkpoints", ge=1)
    every_steps: int = opt(0, "also checkpoint every N optimizer steps mid-epoch (0 = off)", ge=0,
                            lowest="off")
    keep_last: int = opt(3, "numbered checkpoints kept (last.pt and best.pt are always kept)", ge=1)
    writer: str = opt("auto", "how checkpoints are written: background (a CPU snapshot at the save point, written while "
                      "training goes on), sync (before training goes on), auto = background on a GPU or when training "
                      "leaves a CPU core free, sync when it keeps every core busy", choices=("auto", "background", "sync"))


@dataclass
class RunConfig:
    data: DataConfig = opt(factory=DataConfig, doc="dataset and loading")
    model: ModelConfig = opt(factory=ModelConfig, doc="network")
    loss: LossConfig = opt(factory=LossConfig, doc="loss function")
    optimizer: OptimizerConfig = opt(factory=OptimizerConfig, doc="optimizer and parameter groups")
    scheduler: SchedulerConfig = opt(factory=SchedulerConfig, doc="learning-rate schedule")
    train: TrainConfig = opt(factory=TrainConfig, doc="training loop")
    eval: EvalConfig = opt(factory=EvalConfig, doc="how the trained network predicts")
    export: ExportConfig = opt(factory=ExportConfig, doc="files written for other tools at the end of a run")
    device: DeviceConfig = opt(factory=DeviceConfig, doc="device and parallel mode")
    monitor: MonitorConfig = opt(factory=MonitorConfig, doc="live statistics")
    checkpoint: CheckpointConfig = opt(factory=CheckpointConfig, doc="checkpoints")

    @property
    def multilabel(self) -> bool:
        """Several labels per image (issue #36): the labels file data.labels says which."""
        return bool(self.data.labels)

    # ---- conversions -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Any, source: str | None = None) -> RunConfig:
        problems: list[str] = []
        cfg = _build(cls, raw if raw is not None else {}, "", problems)
        if not problems:
            problems.extend(_cross_checks(cfg))
        if problems:
            raise ConfigError(problems, source)
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def with_overrides(self, assignments: list[str]) -> RunConfig:
        """A copy with `key.path=value` assignments applied (values parsed as YAML)."""
        raw = self.to_dict()
        apply_overrides(raw, assignments)
        return RunConfig.from_dict(raw, source="--set")

    def resolve_paths(self, base: Path) -> RunConfig:
        """Make every file path absolute, relative to `base` (the config file's folder)."""
        def fix(p: str | None) -> str | None:
            if not p or self.device.host:  # a host's paths are resolved there
                return p
            p = os.path.expanduser(p)
            return p if os.path.isabs(p) else str((base / p).resolve())

        out = RunConfig.from_dict(self.to_dict())
        out.data.train_dir = fix(out.data.train_dir) or ""
        out.data.val_dir = fix(out.data.val_dir)
        out.data.test_dir = fix(out.data.test_dir)
        out.data.cache_dir = fix(out.data.cache_dir)
        out.data.exclude = fix(out.data.exclude)
        out.data.labels, out.data.val_labels, out.data.test_labels = (
            fix(out.data.labels), fix(out.data.val_labels), fix(out.data.test_labels))
        if not is_weights_name(out.model.weights):
            out.model.weights = fix(out.model.weights)
        if is_user_model(out.model.name):
            path, cls_name = out.model.name.rsplit(":", 1)
            out.model.name = f"{fix(path)}:{cls_name}"
        return out


def is_weights_name(weights: str | None) -> bool:
    """model.weights names the model's published weights (DEFAULT, IMAGENET1K_V2, ...), not a file."""
    return bool(weights) and re.fullmatch(r"[A-Z][A-Z0-9_]*", weights) is not None


def is_user_model(name: str) -> bool:
    """model.name is the user's own class: path/to/file.py:ClassName."""
    return ":" in name and name.rpartition(":")[0].endswith(".py")


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config file, apply `--set` overrides, resolve relative paths against its folder."""
    return config_from(read_config_file(path), path, overrides)


def read_config_file(path: str | os.PathLike) -> Any:
    """The YAML of a config (or sweep) file, parsed once (trainer.core.user_yaml: a regular file, bounded, aliases
    counted); ConfigError naming the file when it cannot be read."""
    try:
        raw = read_yaml_file(path, "YAML config file")
    except (YamlError, UserFileError) as e:
        raise ConfigError([str(e).removeprefix(f"{path}: ")], str(path)) from None
    return {} if raw is None else raw


def config_from(raw: Any, path: str | os.PathLike, overrides: list[str] | None = None) -> RunConfig:
    """The checked config of `raw` (the parsed file at `path`), with `--set` overrides applied (to a copy) and
    relative paths resolved against the file's folder."""
    path = Path(path)
    if overrides:
        if not isinstance(raw, dict):
            raise ConfigError(["top level must be a mapping of sections"], str(path))
        raw = copy.deepcopy(raw)
        apply_overrides(raw, overrides)
    cfg = RunConfig.from_dict(raw, source=str(path))
    return cfg.resolve_paths(path.parent.resolve())


def save_config(cfg: RunConfig, path: str | os.PathLike) -> None:
    """Write the config as YAML atomically."""
    atomic_write_text(path, cfg.to_yaml())


def apply_overrides(raw: dict, assignments: list[str]) -> None:
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError([f"--set {shown(item)}: expected key.path=value"])
        parts = key.strip().split(".")
        node = raw
        for part in parts[:-1]:
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = {}
                node[part] = nxt
            if not isinstance(nxt, dict):
                raise ConfigError([f"{key}: {part} is not a section"])
            node = nxt
        if len(value) > MAX_CONFIG_BYTES:
            raise ConfigError([f"--set {key}: a value of {len(value):,} characters; at most {MAX_CONFIG_BYTES:,}"])
        try:
            node[parts[-1]] = parse_yaml(value, f"--set {key}") if value.strip() else None
        except YamlError as e:
            raise ConfigError([str(e)]) from None


# ---- validation ------------------------------------------------------------------------------

def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string", dict: "a mapping",
            type(None): "null"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and (value is None or (value == "" and str in inner)):
            return None  # an empty text field means "not set"
        for option in inner[:-1]:  # the first type the value fits; the last one reports the problem
            attempt: list[str] = []
            converted = _convert(option, value, path, attempt)
            if not attempt:
                return converted
        if len(inner) > 1 and not isinstance(value, (str, list)):
            problems.append(f"{path}: must be {_describe(tp)}, got {shown(value)}")
            return None
        return _convert(inner[-1], value, path, problems)
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{path}: must be {_describe(tp)}, got {shown(value)}")
            return None
        (item_tp,) = typing.get_args(tp)
        return [_convert(item_tp, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path, problems)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        try:
            number = parse_float(value)
        except ValueError:
            pass
        else:
            if not math.isfinite(number):
                problems.append(f"{path}: must be a finite number, got {shown(value)}")
                return None
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict:
        if isinstance(value, dict):
            return value
    problems.append(f"{path}: must be {_describe(tp)}, got {shown(value)}")
    return None


def choice_text(choice: Any) -> str:
    """A key's allowed value as a user writes it in YAML (true, not True)."""
    return str(choice).lower() if isinstance(choice, bool) else str(choice)


def _check_range(path: str, value: Any, meta: dict, problems: list[str]) -> None:
    if value is None:
        return
    choices = meta.get("choices")
    for item in value if isinstance(value, list) else [value]:
        if choices and item not in choices:
            allowed = ", ".join(map(choice_text, choices))
            problems.append(f"{path}: must be one of {allowed}; got {shown(item)}")
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        for key, ok, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                              ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")):
            bound = meta.get(key)
            if bound is not None and not ok(v, bound):
                limit = bound if isinstance(bound, int) else f"{bound:g}"
                problems.append(f"{path}: must be {word} {limit}, got {shown(v)}")


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    where = prefix or "config"
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping, got {shown(raw)}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            path = f"{prefix}.{key}" if prefix else str(key)
            problems.append(f"{path}: unknown key (allowed: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        path = f"{prefix}.{f.name}" if prefix else f.name
        before = len(problems)
        value = _convert(hints[f.name], raw[f.name], path, problems)
        if len(problems) == before:
            _check_range(path, value, f.metadata, problems)
            kwargs[f.name] = value
    return cls(**kwargs)


DATASET_KEYS = ("data.train_dir", "data.val_dir", "data.test_dir", "data.exclude", "data.labels", "data.val_labels",
                "data.test_labels")  # the keys that name a run's dataset: what New keeps, every other at its default
MULTILABEL_LOSS = "bce"  # the loss a multi-label run (data.labels set) starts from
MULTILABEL_LOSSES = ("bce", "asl")  # the losses of multi-label runs, and only of them
MIXED_LABEL_LOSSES = ("cross_entropy", "bce", "asl")  # the losses that take MixUp's and CutMix's blended labels


def loss_for_labels(labels_file: bool, loss: str) -> str:
    """The loss a form holds after data.labels was set or cleared: a multi-label loss with a labels file (the one
    chosen, else MULTILABEL_LOSS), a single-label one without (the one chosen, else the default)."""
    if labels_file:
        return loss if loss in MULTILABEL_LOSSES else MULTILABEL_LOSS
    return RunConfig().loss.name if loss in MULTILABEL_LOSSES else loss


def _multilabel_checks(cfg: RunConfig) -> list[str]:
    """A multi-label run (data.labels) reads its splits from labels files and trains with bce; the keys of one label
    per image are refused with it, and the other way round."""
    d, problems = cfg.data, []
    if not cfg.multilabel:
        for key in ("val_labels", "test_labels"):
            if getattr(d, key):
                problems.append(f"data.{key}: needs data.labels (the training images' labels file)")
        if cfg.loss.name in MULTILABEL_LOSSES:
            problems.append(f"loss.name: {cfg.loss.name} is a multi-label loss; set data.labels (the labels file) or "
                            f"choose cross_entropy")
        if cfg.train.early_stop.metric == "val_map":
            problems.append("train.early_stop.metric: val_map is measured in multi-label runs (data.labels); use "
                            "val_acc or val_loss")
        return problems
    if cfg.loss.name not in MULTILABEL_LOSSES:
        problems.append(f"loss.name: a multi-label run (data.labels) trains with bce or asl, not {cfg.loss.name}")
    elif cfg.loss.name == "asl" and (cfg.loss.class_weights != "none" or cfg.loss.label_smoothing):
        problems.append("loss.class_weights, loss.label_smoothing: asl weighs positives and negatives itself; leave "
                        "them none and 0")
    for key, instead in (("val_dir", "val_labels"), ("test_dir", "test_labels")):
        if getattr(d, key):
            problems.append(f"data.{key}: a multi-label run takes those images from data.{instead} (a labels file)")
    if d.test_split and d.test_labels:
        problems.append("data.test_split: set it or data.test_labels, not both (the test set is one or the other)")
    if d.sampler == "balanced":
        problems.append("data.sampler: balanced draws by class; a multi-label run uses shuffle (loss.class_weights "
                        "auto weights rare labels instead)")
    if cfg.train.early_stop.metric == "val_acc":
        problems.append("train.early_stop.metric: a multi-label run watches val_map or val_loss")
    return problems


def _cross_checks(cfg: RunConfig) -> list[str]:
    problems = []
    d = cfg.data
    if isinstance(d.mean, str) and d.mean != "auto" or isinstance(d.mean, list) and len(d.mean) != 3:
        problems.append(f"data.mean: must be auto or have 3 values (RGB), got {shown(d.mean)}")
    if isinstance(d.std, str) and d.std != "auto" or isinstance(d.std, list) and (
            len(d.std) != 3 or any(s <= 0 for s in d.std)):
        problems.append(f"data.std: must be auto or have 3 values > 0 (RGB), got {shown(d.std)}")
    if isinstance(d.augment.crop_scale_min, str) and d.augment.crop_scale_min != "auto":
        problems.append(f"data.augment.crop_scale_min: must be a fraction of the image (0 < x <= 1) or auto, got "
                        f"{shown(d.augment.crop_scale_min)}")
    mixing = [k for k in ("mixup", "cutmix") if getattr(d.augment, k)]
    if mixing and cfg.loss.name not in MIXED_LABEL_LOSSES:
        problems.append(f"data.augment.{mixing[0]}: mixed labels need loss.name {', '.join(MIXED_LABEL_LOSSES)}, "
                        f"not {cfg.loss.name}")
    if 0 < d.image_width < 8:
        problems.append(f"data.image_width: must be 0 (square) or >= 8, got {d.image_width}")
    if d.test_split and d.test_dir:
        problems.append("data.test_split: set it or data.test_dir, not both (the test set is one or the other)")
    if d.test_split + (0 if d.val_dir else d.val_split) >= 0.9:
        problems.append(f"data.test_split: with data.val_split {d.val_split:g} it leaves under 10% of the images to "
                        f"train on; lower one of them")
    problems += _multilabel_checks(cfg)
    if cfg.loss.class_weights != "none" and cfg.loss.name == "mse":
        problems.append("loss.class_weights: needs a loss that weights classes (cross_entropy, nll or multi_margin), "
                        "not mse")
    mlflow = cfg.monitor.mlflow
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", mlflow or "")
    if mlflow and mlflow != "env" and (not scheme or scheme.group(1).lower().split("+")[0] not in MLFLOW_SCHEMES):
        why = ("MLflow's own file store no longer takes new runs (it is in maintenance mode): run `mlflow server` "
               "and give its http:// address, or a sqlite:///path/mlflow.db store" if scheme and
               scheme.group(1).lower() == "file" else
               "must be a tracking URI: http(s)://, sqlite:///, postgresql://, mysql:// or databricks, env "
               "(MLFLOW_TRACKING_URI) or empty (off)")
        problems.append(f"monitor.mlflow: {why}; got {shown(mlflow)}")
    if mlflow and not cfg.monitor.mlflow_experiment.strip():
        problems.append("monitor.mlflow_experiment: must name an experiment when monitor.mlflow is set")
    if len(cfg.monitor.mlflow_experiment) > MAX_MLFLOW_NAME:
        problems.append(f"monitor.mlflow_experiment: at most {MAX_MLFLOW_NAME} characters, got "
                        f"{len(cfg.monitor.mlflow_experiment):,}")
    m = cfg.model
    if m.freeze_backbone and m.unfreeze_at_epoch:
        problems.append("model.unfreeze_at_epoch: set it or model.freeze_backbone, not both (a linear probe never "
                        "unfreezes)")
    if m.unfreeze_at_epoch and m.unfreeze_at_epoch >= cfg.train.epochs:
        problems.append(f"model.unfreeze_at_epoch: {m.unfreeze_at_epoch} is not before train.epochs "
                        f"({cfg.train.epochs}); the backbone would never train (use model.freeze_backbone for that)")
    for i, g in enumerate(cfg.optimizer.groups):
        if not g.pattern.strip():
            problems.append(f"optimizer.groups[{i}].pattern: must not be empty")
    dev = cfg.device
    if dev.type == "cuda" and not dev.gpus:
        problems.append("device.gpus: must list at least one GPU index when device.type is cuda")
    if dev.parallel == "dp" and dev.type != "cuda":
        problems.append("device.parallel: dp (DataParallel) needs device.type cuda")
    if dev.parallel == "ddp" and dev.type == "mps":
        problems.append("device.parallel: ddp needs device.type cpu or cuda (PyTorch has no collective backend for "
                        "mps); use parallel none on Apple's GPU")
    if dev.parallel == "dp" and cfg.data.batch_size < len(dev.gpus):
        problems.append(f"data.batch_size: dp splits each batch over {len(dev.gpus)} GPUs, "
                        f"so it must be >= {len(dev.gpus)}, got {cfg.data.batch_size}")
    if dev.parallel == "ddp" and dev.backend == "nccl" and dev.type != "cuda":
        problems.append("device.backend: nccl needs device.type cuda; use gloo on cpu")
    if dev.node_rank >= dev.nnodes:
        problems.append(f"device.node_rank: must be < device.nnodes ({dev.nnodes}), got {dev.node_rank}")
    if dev.nnodes > 1 and dev.master_port == 0:
        problems.append("device.master_port: multi-node runs need a fixed port that every node uses")
    if dev.parallel == "ddp" and dev.launcher == "spawn" and dev.nnodes > 1:
        problems.append("device.launcher: spawn is single-node; use torchrun for device.nnodes > 1")
    if cfg.train.sync_batchnorm and dev.type == "cpu" and dev.parallel == "ddp":
        problems.append("train.sync_batchnorm: SyncBatchNorm runs on GPUs only; on cpu leave it off")
    if dev.parallel == "ddp" and dev.launcher == "horovod" and dev.nnodes > 1:
        problems.append("device.launcher: horovod runs start on one machine here; use torchrun for device.nnodes > 1")
    if cfg.train.compile and dev.parallel == "dp":
        problems.append("train.compile: not supported with device.parallel dp; use ddp (or leave compile off)")
    return problems


def key_meta(key: str) -> dict:
    """What a form needs to know of a config key, declared once (issue #51: a widget's limits are the config's):
    its type name, default, description, choices and bounds (ge, gt, le, lt; None where there is none), the step a
    form moves it by and the word for its lowest value (None where it has none)."""
    cls: Any = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    f = cls.__dataclass_fields__[name]
    meta = dict(f.metadata)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return {"type": _describe(typing.get_type_hints(cls)[name]), "default": default, "doc": meta.get("doc", ""),
            "choices": meta.get("choices"), **{b: meta.get(b) for b in ("ge", "gt", "le", "lt", "step", "lowest")}}


def key_choices(key: str) -> tuple:
    """The allowed values of a config key, e.g. key_choices("train.amp") (forms offer exactly these)."""
    cls: Any = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    return cls.__dataclass_fields__[name].metadata["choices"]


def describe_keys(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key path, type, default, description) for every leaf key, for docs and forms."""
    rows = []
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe_keys(tp, path + "."))
            continue
        doc = f.metadata.get("doc", "")
        if f.metadata.get("choices"):
            doc += f" ({' | '.join(map(choice_text, f.metadata['choices']))})"
        rows.append((path, _describe(tp), getattr(instance, f.name), doc))
    return rows
