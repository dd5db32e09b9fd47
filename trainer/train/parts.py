"""Everything a run trains with, built once from the config: `build()` returns the parts, the loop uses them.

In the style of torchvision's references: plain construction with explicit inputs, no training in here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from trainer.core.config import RunConfig
from trainer.core.groups import is_head_parameter, pattern_matches
from trainer.core.schedule import Stretch
from trainer.data import loader as data_mod
from trainer.data.frame import Frame
from trainer.data.suggest import resolve_augment
from trainer.device.machine import fast_gpu_math
from trainer.device.precision import Precision, choose_precision, fill_momentum_buffers
from trainer.device.strategy import Strategy
from trainer.model.ema import WeightAverage
from trainer.model.models import ModelError, build_model, choose_memory_format, head_name
from trainer.model.weights import fetch_named, resolve_normalisation
from trainer.train.optim import build_loss, build_optimizer, build_param_groups, build_scheduler
from trainer.train.reporter import Reporter
from trainer.train.stats import AnomalyWatch, GradMonitor

log = logging.getLogger("trainer")


@dataclass
class Parts:
    data: data_mod.DataBundle
    workers: int
    model: nn.Module  # as wrapped by the strategy (DataParallel / DDP) for training
    net: nn.Module  # the plain network: evaluation, statistics, checkpoints
    groups: list[dict]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    precision_reason: str
    memory_format: torch.memory_format
    criterion: nn.Module
    augment: data_mod.BatchAugment
    aug_generator: torch.Generator
    monitor: GradMonitor
    anomalies: AnomalyWatch
    histogram_layers: list[str]
    steps_per_epoch: int
    stretch: Stretch  # the schedule's clock (train.replan moves its end)
    mean: list[float]  # the normalisation in effect (data.mean/std, or what auto means for these weights)
    std: list[float]
    normalisation_source: str
    augment_choices: list  # what data.augment's auto values became, and why ({"key", "value", "why"} each)
    weights: dict | None  # what was loaded: name, file, sha256
    head: str | None  # the classifier head's module name
    backbone: list[nn.Parameter]  # every parameter outside the head
    backbone_norms: list[nn.Module]  # the backbone's BatchNorm layers (statistics frozen while it is)
    linear_probe: bool = False  # the backbone never trains (its parameters do not even take gradients)
    average: WeightAverage | None = None  # train.ema: the averaged weights
    unfreeze_at_epoch: int = 0  # gradual unfreezing: the backbone trains from this epoch (0-based) on

    def backbone_frozen(self, epoch: int) -> bool:
        """Whether the backbone is frozen in `epoch` (a linear probe always; gradual unfreezing until then)."""
        return self.linear_probe or epoch < self.unfreeze_at_epoch

    def drop_frozen_grads(self, epoch: int) -> None:
        """Gradual unfreezing, before each step: while frozen, the backbone's gradients are dropped, so the
        optimizer leaves its weights (and keeps no state for them); its parameters stay in the optimizer, the
        schedule and DDP from the start, so unfreezing needs no rebuild and resumes exactly. Once unfrozen, SGD's
        momentum buffers the backbone lacks start at zero (`fill_momentum_buffers`)."""
        if self.linear_probe or not self.unfreeze_at_epoch:
            return
        if epoch < self.unfreeze_at_epoch:
            for p in self.backbone:
                p.grad = None
            return
        fill_momentum_buffers(self.optimizer)

    def train_mode(self, epoch: int) -> None:
        """model.train(), with a frozen backbone's BatchNorm statistics kept as loaded."""
        self.model.train()
        if self.backbone_frozen(epoch):
            for norm in self.backbone_norms:
                norm.eval()

    @property
    def eval_net(self) -> nn.Module:
        """What is validated, checkpointed as the model and exported: the averaged weights with train.ema."""
        return self.average.module if self.average is not None else self.net

    @property
    def classes(self) -> list[str]:
        return self.data.classes

    def epoch_batches(self, cfg: RunConfig, strategy: Strategy, epoch: int) -> list[list[int]]:
        """This rank's training batches of `epoch` (the order depends only on the seed and the epoch)."""
        labels = [label for _, label in self.data.train.samples] if cfg.data.sampler == "balanced" else None
        return data_mod.epoch_batches(len(self.data.train), cfg.data.batch_size, seed=cfg.train.seed, epoch=epoch,
                                      rank=strategy.rank, world=strategy.world_size, labels=labels)


def prepare_data(cfg: RunConfig, strategy: Strategy, reporter: Reporter, workers: int,
                 should_stop=None) -> tuple[data_mod.DataBundle, list[dict]]:
    """The run's data scanned and cached (a published network's weights fetched first: offline and not cached fails
    at once, not after the images are decoded), data.augment's auto values decided on it; (data, the choices)."""
    fetch_named(cfg.model, reporter.download_progress())
    reporter.prepare("scan", f"scanning {cfg.data.train_dir}")
    data = data_mod.load_data(cfg.data, cfg.train.seed, workers, reporter.cache_progress(), should_stop)
    reporter.bad_files(data.skipped)
    # data.augment's auto values, decided on this data (every rank alike: the rule reads the same sample)
    augment_choices = resolve_augment(cfg.data.augment, SimpleNamespace(
        classes=data.classes, samples=data.train.samples, labels_file=data.multilabel))
    for name, count in data.classes_without_val():
        reporter.warning("no_val_images", f"class {name!r} has no validation images ({count} in training): its "
                         f"validation accuracy cannot be measured; add images or set data.val_dir", cls=name)
    if strategy.device.type == "cuda":
        fast_gpu_math()
        if cfg.data.gpu_cache:
            data_mod.keep_on_device(data, strategy.device)

    if cfg.loss.class_weights == "auto":
        from trainer.train.optim import class_weights, positive_weights

        if data.multilabel:
            weights, how = positive_weights(data.train_counts(), len(data.train)).tolist(), "positives' weights"
        else:
            weights, how = class_weights(data.train_counts()).tolist(), "class weights (inverse frequency)"
        log.info("%s: %s", how, ", ".join(f"{name} {w:.3g}" for name, w in zip(data.classes, weights)))
    return data, augment_choices


def build(cfg: RunConfig, strategy: Strategy, reporter: Reporter, should_stop=None) -> Parts:
    """Scan and cache the data, build the model, optimizer, schedule, precision and monitors for this rank."""
    workers = data_mod.default_workers(cfg.data.num_workers)
    data, augment_choices = prepare_data(cfg, strategy, reporter, workers, should_stop)
    reporter.prepare("model", f"building {cfg.model.name}")
    model, weights = build_model(cfg.model, len(data.classes), Frame.of(cfg.data).shape, cfg.train.seed,
                                 reporter.download_progress())
    mean, std, source = resolve_normalisation(cfg.data.mean, cfg.data.std, cfg.model)
    head = head_name(model)
    backbone = [p for n, p in model.named_parameters() if not is_head_parameter(head, n)]
    head_modules = {head} if head else set()
    backbone_norms = [m for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                      and n not in head_modules]
    if cfg.model.freeze_backbone:
        if head is None:
            raise ModelError("model.freeze_backbone: this model has no Linear classifier head to train alone")
        for p in backbone:
            p.requires_grad_(False)
    memory_format = choose_memory_format(cfg.train.memory_format, cfg.model.name, model, strategy.device)
    model = model.to(memory_format=memory_format)
    groups = build_param_groups(model, cfg.optimizer)
    wrapped = strategy.wrap(model)
    net = strategy.unwrap(wrapped)
    optimizer = strategy.wrap_optimizer(build_optimizer(groups, cfg.optimizer), net, cfg.train.grad_accum_steps)
    batches = data_mod.epoch_batches(len(data.train), cfg.data.batch_size, seed=cfg.train.seed, epoch=0,
                                     rank=strategy.rank, world=strategy.world_size)
    steps_per_epoch = math.ceil(len(batches) / cfg.train.grad_accum_steps)
    stretch = Stretch(steps_per_epoch * cfg.train.epochs)  # moved only by train.replan
    scheduler = build_scheduler(optimizer, steps_per_epoch, cfg.train.epochs, cfg.scheduler, stretch)
    precision_name, precision_reason = choose_precision(cfg.train.amp, strategy.device)
    average = WeightAverage(net, cfg.train.ema) if cfg.train.ema else None
    if cfg.train.compile:
        log.info("compiling the model (torch.compile); the first steps are slow")
        wrapped.compile()

    monitor = GradMonitor(net)
    mon = cfg.monitor
    names = monitor.names
    chosen = [n for n in names if any(pattern_matches(p, n) for p in mon.histogram_layers)]
    return Parts(
        data=data, workers=workers, model=wrapped, net=net, groups=groups, optimizer=optimizer, scheduler=scheduler,
        precision=Precision(precision_name, strategy), precision_reason=precision_reason,
        memory_format=memory_format,
        criterion=build_loss(cfg.loss, len(data.classes), data.train_counts(), strategy.device, len(data.train)),
        augment=data_mod.BatchAugment(cfg.data.augment, mean, std, strategy.device, memory_format),
        aug_generator=torch.Generator(), monitor=monitor,
        anomalies=AnomalyWatch(mon.loss_spike_factor, mon.grad_explode, mon.grad_vanish),
        histogram_layers=chosen or ([names[0], names[-1]] if len(names) > 1 else names),
        steps_per_epoch=steps_per_epoch, stretch=stretch, mean=mean, std=std, normalisation_source=source, weights=weights,
        augment_choices=augment_choices,
        head=head, backbone=backbone, backbone_norms=backbone_norms, linear_probe=cfg.model.freeze_backbone,
        unfreeze_at_epoch=cfg.model.unfreeze_at_epoch, average=average)
