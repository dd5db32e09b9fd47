"""Optimizer with parameter groups, loss function and learning-rate schedule, chosen by name."""

from __future__ import annotations

import torch
from torch import nn

from trainer.core.config import ConfigError, LossConfig, OptimizerConfig, SchedulerConfig
from trainer.core.groups import assign_groups, unmatched_message, unmatched_patterns
from trainer.core.schedule import Stretch, lr_factor


def build_param_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """torch.optim param groups: configured groups in order, then the default group; frozen ones left out.

    Each group dict carries a `name` (the pattern, or "default") so events and the app can label it.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # a frozen backbone is left out
    names = [n for n, _ in named]
    patterns = [g.pattern for g in cfg.groups]
    unmatched = unmatched_patterns(names, patterns)
    if unmatched:
        i = unmatched[0]
        raise ConfigError([unmatched_message(i, patterns[i], names)])
    assignment = assign_groups(names, patterns)
    buckets: list[list[nn.Parameter]] = [[] for _ in cfg.groups]
    default: list[nn.Parameter] = []
    for (_, param), idx in zip(named, assignment):
        if idx is None:
            default.append(param)
        elif cfg.groups[idx].freeze:
            param.requires_grad_(False)
        else:
            buckets[idx].append(param)
    groups = []
    for g, params in zip(cfg.groups, buckets):
        if g.freeze or not params:
            continue
        group = {"params": params, "name": g.pattern}
        for key in ("lr", "weight_decay", "momentum"):
            value = getattr(g, key)
            if value is not None:
                group[key] = value
        groups.extend(split_norm_decay(group, cfg.norm_weight_decay))
    if default:
        groups.extend(split_norm_decay({"params": default, "name": "default"}, cfg.norm_weight_decay))
    if not groups:
        raise ConfigError(["optimizer.groups: every parameter is frozen; nothing would train"])
    return groups


def split_norm_decay(group: dict, norm_weight_decay: float | None) -> list[dict]:
    """`group`, with its one-dimensional parameters (normalisation weights and biases: timm's and torchvision's
    rule) moved to a second group of the same name at `norm_weight_decay` (None: no split). That group is marked
    `no_decay`; events and schedules count it with its namesake (same learning rate)."""
    if norm_weight_decay is None:
        return [group]
    flat = [p for p in group["params"] if p.ndim <= 1]
    rest = [p for p in group["params"] if p.ndim > 1]
    if not flat:
        return [group]
    out = [{**group, "params": rest}] if rest else []
    out.append({**group, "params": flat, "weight_decay": norm_weight_decay, "no_decay": True})
    return out


def group_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """The learning rate of each configured group (the no-decay halves of `split_norm_decay` not repeated)."""
    seen, out = set(), []
    for g in optimizer.param_groups:
        if g.get("name") not in seen:
            seen.add(g.get("name"))
            out.append(g["lr"])
    return out


def merged_groups(groups: list[dict]) -> list[dict]:
    """{name, tensors, params} per configured group, for the start event (the no-decay halves counted in)."""
    out: dict[str, dict] = {}
    for g in groups:
        row = out.setdefault(g["name"], {"name": g["name"], "tensors": 0, "params": 0})
        row["tensors"] += len(g["params"])
        row["params"] += sum(p.numel() for p in g["params"])
    return list(out.values())


def build_optimizer(groups: list[dict], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """SGD and Adam(W) run fused (one kernel over all parameters: ~5x faster than foreach for AdamW on a CPU,
    bench: resnet18 46 -> 9 ms per step); the others use foreach."""
    name = cfg.name
    common = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    momentum_opts = {"sgd", "nesterov", "rmsprop"}
    if name not in momentum_opts:
        for g in groups:
            g.pop("momentum", None)
    if name in ("sgd", "nesterov"):
        return torch.optim.SGD(groups, momentum=cfg.momentum, nesterov=name == "nesterov"
                               and cfg.momentum > 0, **common, fused=True)
    if name == "adam":
        return torch.optim.Adam(groups, **common, fused=True)
    if name == "adamw":
        return torch.optim.AdamW(groups, **common, fused=True)
    if name == "rmsprop":
        return torch.optim.RMSprop(groups, momentum=cfg.momentum, **common, foreach=True)
    if name == "adagrad":
        return torch.optim.Adagrad(groups, **common, foreach=True)
    raise ConfigError([f"optimizer.name: unknown optimizer {name!r}"])


MAX_POSITIVE_WEIGHT = 100.0  # a label on 1 image in 1,000 counts 100x, not 999x: one image must not steer the run


def class_weights(counts: list[int]) -> torch.Tensor:
    """Inverse class frequency, normalised to a mean of 1 over the classes (a class without training images gets 0)."""
    n = torch.tensor(counts, dtype=torch.float32)
    present = n > 0
    weights = torch.zeros_like(n)
    inverse = 1.0 / n[present]
    weights[present] = inverse / inverse.mean()
    return weights


def positive_weights(counts: list[int], images: int) -> torch.Tensor:
    """Multi-label: each label's positives weighted by its negatives over its positives (BCEWithLogits' pos_weight),
    at most MAX_POSITIVE_WEIGHT; 1 for a label without training images."""
    pos = torch.tensor(counts, dtype=torch.float32)
    weights = ((images - pos) / pos.clamp_min(1)).clamp(max=MAX_POSITIVE_WEIGHT)
    return torch.where(pos > 0, weights, torch.ones_like(weights))


class MultiLabelLoss(nn.Module):
    """Binary cross-entropy per label on multi-hot targets, with label smoothing (targets eps/2 and 1 - eps/2) and
    optional positive weights."""

    def __init__(self, pos_weight: torch.Tensor | None = None, smoothing: float = 0.0):
        super().__init__()
        self.bce = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
        self.smoothing = smoothing

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = targets.to(logits.dtype)
        if self.smoothing:
            targets = targets * (1 - self.smoothing) + self.smoothing / 2
        return self.bce(logits, targets)


class AsymmetricLoss(nn.Module):
    """Multi-label ASL (Ridnik et al., "Asymmetric Loss for Multi-Label Classification", ICCV 2021): a negative's loss
    is down-weighted by p^gamma_neg after its probability is shifted down by `clip` (an easy negative, p < clip,
    counts for nothing), a positive's by (1-p)^gamma_pos; summed over the labels, averaged over the images. Measured
    above bce on real images (docs/benchmarks.md, "Multi-label loss")."""

    def __init__(self, gamma_neg: float = 4.0, gamma_pos: float = 0.0, clip: float = 0.05):
        super().__init__()
        self.gamma_neg, self.gamma_pos, self.clip = gamma_neg, gamma_pos, clip

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = targets.to(torch.float32)
        p = torch.sigmoid(logits.float())
        p_neg = (p - self.clip).clamp(min=0)
        pos = targets * torch.log(p.clamp(min=1e-8)) * (1 - p) ** self.gamma_pos
        neg = (1 - targets) * torch.log((1 - p_neg).clamp(min=1e-8)) * p_neg ** self.gamma_neg
        return -(pos + neg).sum() / logits.shape[0]


def build_loss(cfg: LossConfig, num_classes: int, class_counts: list[int] | None = None,
               device: torch.device | None = None, images: int = 0):
    """A callable (logits, labels) -> scalar loss; with `class_weights: auto`, each class weighted by its rarity
    (bce, multi-label: each label's positives, from `class_counts` of `images`)."""
    if cfg.name == "asl":
        return AsymmetricLoss()
    if cfg.name == "bce":
        weights = positive_weights(class_counts or [1] * num_classes, images) if cfg.class_weights == "auto" else None
        return MultiLabelLoss(weights.to(device or "cpu") if weights is not None else None, cfg.label_smoothing)
    weight = None
    if cfg.class_weights == "auto":
        weight = class_weights(class_counts or [1] * num_classes).to(device or "cpu")
    if cfg.name == "cross_entropy":
        return nn.CrossEntropyLoss(weight=weight, label_smoothing=cfg.label_smoothing)
    if cfg.name == "nll":
        nll = nn.NLLLoss(weight=weight)
        return lambda logits, y: nll(torch.log_softmax(logits, dim=1), y)
    if cfg.name == "mse":
        mse = nn.MSELoss()
        return lambda logits, y: mse(torch.softmax(logits, dim=1),
                                     nn.functional.one_hot(y, num_classes).to(logits.dtype))
    if cfg.name == "multi_margin":
        return nn.MultiMarginLoss(weight=weight)
    raise ConfigError([f"loss.name: unknown loss {cfg.name!r}"])


def build_scheduler(optimizer, steps_per_epoch: int, epochs: int, cfg: SchedulerConfig, stretch: Stretch | None = None):
    """The per-step schedule; with `stretch`, on its clock (a run whose length is re-planned)."""
    total = steps_per_epoch * epochs
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(stretch.virtual(step) if stretch else step, steps_per_epoch, total, cfg))
