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
from dataclasses import dataclass

from trainer.core import clock
from trainer.core.config import ConfigError, SchedulerConfig


def lr_factor(step: int, steps_per_epoch: int, total_steps: int, cfg: SchedulerConfig) -> float:
    """Multiplier of each group's base lr at optimizer step `step` (warm-up, then the schedule)."""
    warmup = cfg.warmup_epochs * steps_per_epoch
    if cfg.name == "onecycle" and warmup == 0:
        warmup = 0.3 * total_steps
    if step < warmup:
        return min(1.0, (step + 1) / warmup)  # a stretched step is fractional: never past the peak
    epoch = int(step // max(1, steps_per_epoch))
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


@dataclass
class Stretch:
    """The schedule's clock for a run whose length is re-planned (`train.replan` under `train.budget`): the schedule
    is laid out over `total` steps and a step is mapped onto it by the share of the run done, so a re-plan in either
    direction never leaves the learning rate annealed with budget left (a run planned for 1 epoch and re-planned to
    20 trained 19 of them at 1e-6) and the end of the annealing is the end of the run.

    With a `deadline` (one process: its own clock decides, and no other rank's could differ) the share is that of the
    training budget's time spent, so warm-up, peak and annealing follow the budget whatever the re-plans say and
    however the machine's speed changes, and the last step of the budget is the end of the annealing. Across ranks
    (no deadline) it is the share of the planned steps done: from a re-plan on, the schedule goes from the share then
    done to its end at `end_step`."""

    total: int
    origin_step: int = 0
    origin_virtual: float = 0.0
    end_step: int = 0
    deadline: tuple[float, float] | None = None  # (training began, the budget ends), clock.now() seconds
    final: tuple[int, float, int] | None = None  # (step, clock then, end step): the last planned epoch ends annealed

    def __post_init__(self):
        self.end_step = self.end_step or self.total

    def virtual(self, step: int) -> float:
        """Where optimizer step `step` is on the schedule's own clock (the step itself until a re-plan)."""
        if self.deadline is not None:
            virtual = self.spent_share() * self.total
            if self.final is not None:  # the plan ends before the budget: its last epoch still ends annealed
                step0, virtual0, end = self.final
                virtual = max(virtual, virtual0 + (step - step0) * (self.total - virtual0) / max(1, end - step0))
            return min(float(self.total), virtual)
        if self.end_step == self.total and self.origin_step == 0:
            return step
        span = max(1, self.end_step - self.origin_step)
        return min(float(self.total), self.origin_virtual + (step - self.origin_step) * (self.total - self.origin_virtual)
                   / span)

    def spent_share(self, now: float | None = None) -> float:
        """The share of the training budget's time spent (with a deadline)."""
        start, end = self.deadline
        now = clock.now() if now is None else now
        return min(1.0, max(0.0, (now - start) / max(end - start, 1e-9)))

    def finish_by(self, step: int, end_step: int) -> None:
        """With a deadline: from `step` (the start of the last epoch planned) the clock also goes linearly to the end
        by `end_step`, so a run whose epochs end before its budget still ends annealed."""
        self.final = (step, self.virtual(step), end_step)

    def restretch(self, step: int, end_step: int) -> None:
        """From optimizer step `step` on, the schedule ends at `end_step`: it goes on from the share of the new plan
        done at `step` (not from where the old plan had taken it: annealed is not where a longer run should stay)."""
        end_step = max(end_step, step + 1)
        self.origin_virtual, self.origin_step, self.end_step = self.total * step / end_step, step, end_step
        self.final = None  # a new plan: its own last epoch will say


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
