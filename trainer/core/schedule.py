"""The learning-rate schedule as plain arithmetic (torch-free, so the app can show what it will do), and the rule
for extending a finished run.

Extending (`main.py resume RUN_DIR --epochs TOTAL`, or "Continue for N more epochs" in the app) recomputes the
schedule as if `train.epochs` had been TOTAL from the start and continues it at the run's current step; the warm-up
is not repeated when the run is past it. For cosine that means the learning rate goes back up to the longer
schedule's value at this step, then decays to its end; step, multistep and exponential continue by epoch; none stays
constant.
"""

from __future__ import annotations

import math

from trainer.core.config import ConfigError, SchedulerConfig


def lr_factor(step: int, steps_per_epoch: int, total_steps: int, cfg: SchedulerConfig) -> float:
    """Multiplier of each group's base lr at optimizer step `step` (warm-up, then the schedule)."""
    warmup = cfg.warmup_epochs * steps_per_epoch
    if cfg.name == "onecycle" and warmup == 0:
        warmup = 0.3 * total_steps
    if step < warmup:
        return (step + 1) / warmup
    epoch = step // max(1, steps_per_epoch)
    if cfg.name == "none":
        return 1.0
    if cfg.name == "step":
        return cfg.gamma ** (epoch // cfg.step_size)
    if cfg.name == "multistep":
        return cfg.gamma ** sum(1 for m in cfg.milestones if epoch >= m)
    if cfg.name == "exponential":
        return cfg.gamma ** epoch
    if cfg.name in ("cosine", "onecycle"):
        progress = (step - warmup) / max(1.0, total_steps - warmup)
        floor = 0.0 if cfg.name == "cosine" else 1e-3
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    raise ConfigError([f"scheduler.name: unknown schedule {cfg.name!r}"])


PROGRESSIVE_STEP = 8  # progressive sizes are multiples of this
PROGRESSIVE_RAMP = 0.75  # the full size is reached at this share of the epochs (FFCV's ResNet recipes: ~0.85)


def progressive_size(full: int, fraction: float, epoch: int, epochs: int) -> int:
    """The training image size of `epoch` (0-based) under train.progressive_resize `fraction` (0: always `full`):
    from fraction x full, linearly, to full at PROGRESSIVE_RAMP of the epochs, in multiples of PROGRESSIVE_STEP."""
    if not fraction:
        return full
    low = max(PROGRESSIVE_STEP, round(full * fraction / PROGRESSIVE_STEP) * PROGRESSIVE_STEP)
    ramp = max(1, int(PROGRESSIVE_RAMP * epochs))
    if epoch >= ramp or low >= full:
        return full
    size = low + (full - low) * epoch / ramp
    return int(size // PROGRESSIVE_STEP * PROGRESSIVE_STEP)


def describe_extension(cfg: SchedulerConfig, base_lr: float, epochs_done: int, total_epochs: int,
                       steps_per_epoch: int) -> str:
    """What the learning rate does when a run that trained `epochs_done` epochs is extended to `total_epochs`."""
    total = total_epochs * steps_per_epoch
    step = epochs_done * steps_per_epoch
    before = base_lr * lr_factor(max(step - 1, 0), steps_per_epoch, epochs_done * steps_per_epoch, cfg)
    now = base_lr * lr_factor(step, steps_per_epoch, total, cfg)
    end = base_lr * lr_factor(total - 1, steps_per_epoch, total, cfg)
    return (f"{cfg.name} schedule recomputed for {total_epochs} epochs and continued at epoch {epochs_done + 1}: "
            f"the learning rate goes from {before:.3g} (where it ended) to {now:.3g}, and reaches {end:.3g} at "
            f"epoch {total_epochs}")
