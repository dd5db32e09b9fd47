"""Learning-rate finder: sweep the lr exponentially over a few hundred steps, suggest a value.

The sweep uses the run's own data, model, optimizer and parameter groups (every group's lr scaled together), its
loader, cache and training step, on a throw-away copy: nothing is checkpointed. On a busy machine its threads are
fitted to the cores left as a run's are (device.share_cpu). The suggestion is half-way along the smoothed loss's
longest descent (fastai's `valley`), made only when the curve has a minimum inside the range: after its lowest point
the loss rose again (or diverged). A curve still falling at the range's end, or one that hardly moved, suggests
nothing; the answer says why and which wider range to sweep (`extend`). The smoothing is fastai's `lr_find`'s: an
exponential average started from zero and bias-corrected, so its first points are the raw losses, not a drop that
never happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from trainer.core import clock
from trainer.core.config import RunConfig
from trainer.core.errors import InputError
from trainer.core.events import NullEventWriter
from trainer.core.rundir import RunDir
from trainer.data import loader as data_mod
from trainer.data.frame import Frame
from trainer.device.strategy import Strategy
from trainer.train.engine import StopRequest, seed_everything
from trainer.train.loop import Loop
from trainer.train.parts import build
from trainer.train.reporter import Reporter


class LrFindError(InputError, ValueError):
    """The sweep could not suggest a learning rate."""


def find_lr(cfg: RunConfig, run: RunDir, steps: int = 200, start: float = 1e-6, end: float = 10.0,
            on_point: Callable[[float, float], None] | None = None) -> dict:
    """{'lrs': [...], 'losses': [...], 'suggested_lr': x or None, 'why': ..., 'extend': [start, end] or None} for the
    config's base lr (`_result`); `on_point(lr, smoothed loss)` is told each point as it is measured (the app draws
    the curve as it grows)."""
    cfg.device.parallel = "none"
    cfg.train.ema = 0.0  # a throw-away sweep: no average to keep
    strategy = Strategy(cfg.device)
    seed_everything(cfg.train.seed)
    parts = build(cfg, strategy, Reporter(NullEventWriter(), is_main=False))
    loop = Loop(run, cfg, strategy, parts, Reporter(NullEventWriter(), is_main=False), StopRequest())
    seed_everything(cfg.train.seed)
    with loop.threads_fitted():  # device.share_cpu: a busy machine's cores fitted as a run fits them
        return _sweep(cfg, strategy, parts, loop, steps, start, end, on_point)


def _sweep(cfg: RunConfig, strategy: Strategy, parts, loop: Loop, steps: int, start: float, end: float,
           on_point: Callable[[float, float], None] | None) -> dict:
    """The sweep itself: the run's own batches, augmentation and training step, at an exponentially growing lr."""
    base = [g["lr"] for g in parts.optimizer.param_groups]
    ratio = [b / cfg.optimizer.lr for b in base]
    factor = (end / start) ** (1 / max(1, steps - 1))
    lrs, losses, raw, best = [], [], [], math.inf
    smoother = SmoothedLoss()
    parts.model.train()
    epoch = 0
    while len(lrs) < steps:
        parts.aug_generator.manual_seed(epoch)
        for images, labels in data_mod.iterate_batches(parts.data.train, parts.epoch_batches(cfg, strategy, epoch),
                                                       parts.workers, Frame.of(cfg.data), strategy.device):
            lr = start * factor ** len(lrs)
            for g, r in zip(parts.optimizer.param_groups, ratio):
                g["lr"] = lr * r
            loss, _, _ = loop.train_step(parts.augment(images, parts.aug_generator), labels.to(strategy.device))
            clock.charge_images(cfg.model.name, images.shape[0], images.shape[-2], images.shape[-1])
            loop.fit_threads()  # (every few seconds: the other programs' load)
            value = loss.item()  # host sync per step: acceptable in a short sweep
            corrected = smoother.add(value)
            lrs.append(lr)
            losses.append(corrected)
            raw.append(value)
            best = min(best, corrected)
            if on_point is not None:
                on_point(lr, corrected)
            if not math.isfinite(value) or corrected > 4 * best:
                return _result(lrs, losses, raw, start, end, diverged=True)
            if len(lrs) >= steps:
                break
        epoch += 1
    return _result(lrs, losses, raw, start, end)


class SmoothedLoss:
    """fastai's smoothing: `avg = beta * avg + (1 - beta) * loss` from avg = 0, divided by `1 - beta ** n`."""

    def __init__(self, beta: float = 0.98):
        self.beta, self.average, self.count = beta, 0.0, 0

    def add(self, loss: float) -> float:
        """The smoothed loss after `loss` (the first one is `loss` itself)."""
        self.count += 1
        self.average = self.beta * self.average + (1 - self.beta) * loss
        return self.average / (1 - self.beta ** self.count)


RISE_SHARE = 0.25  # a minimum inside the range: after it the loss climbed back this share of its descent (or diverged)
FLAT = 0.02  # a loss that fell less than this share of itself did not fall (rising: RISE_SHARE of itself, or diverging)
EXTEND = 100.0  # a sweep without a minimum inside its range offers one this many times wider on the side it lacks


def _result(lrs: list[float], losses: list[float], raw: list[float], start: float | None = None,
            end: float | None = None, diverged: bool = False) -> dict:
    """The sweep's analysis: its valley, steepest descent and lowest loss, and a suggestion only when the smoothed
    loss has a minimum inside the range: it fell, and after its lowest point rose again by RISE_SHARE of its fall
    (or diverged, which ends the sweep). Otherwise `suggested_lr` is None, `why` says what the curve did, and
    `extend` is the range to sweep instead."""
    start, end = start or lrs[0], end or lrs[-1]
    finite = [(lr, loss) for lr, loss in zip(lrs, losses) if math.isfinite(loss)]
    if len(finite) < 10:
        raise LrFindError("lr-find: too few steps before the loss diverged; lower --start")
    xs = torch.tensor([math.log10(lr) for lr, _ in finite])
    ys = torch.tensor([loss for _, loss in finite])
    slope = (ys[2:] - ys[:-2]) / (xs[2:] - xs[:-2])
    minimum = int(torch.argmin(ys))
    skip = len(slope) // 10  # the first steps barely move; their noise makes false slopes
    upto = max(skip + 1, minimum - 1)  # descent before the lowest loss, not the blow-up after it
    steepest = int(torch.argmin(slope[skip:upto])) + skip + 1 if upto > skip else minimum
    first, last, middle = valley([loss for _, loss in finite])
    lr = {name: finite[i][0] for name, i in (("middle", middle), ("first", first), ("last", last),
                                             ("steepest", steepest), ("minimum", minimum))}
    low, top, after = float(ys[minimum]), float(ys[:minimum + 1].max()), float(ys[minimum:].max())
    fell, rose = top - low, after - low
    found = {"lrs": lrs, "losses": losses, "raw_losses": raw, "valley": [lr["first"], lr["last"]],
             "valley_lr": lr["middle"], "steepest_lr": lr["steepest"], "min_loss_lr": lr["minimum"],
             "range": [start, end], "suggested_lr": None, "extend": None}
    curve = (f"half-way along the loss's longest descent, {lr['first']:.3g} to {lr['last']:.3g}; steepest descent at "
             f"{lr['steepest']:.3g}, lowest loss at {lr['minimum']:.3g}")
    did_not_fall = fell <= FLAT * abs(top) or minimum <= skip
    if did_not_fall and (diverged or rose > RISE_SHARE * abs(low)):
        found["why"] = (f"no suggestion: the loss rose from the range's start, {start:.3g} (lowest at "
                        f"{lr['minimum']:.3g}); sweep from lower rates")
        found["extend"] = [start / EXTEND, end]
    elif did_not_fall:
        found["why"] = f"no suggestion: the loss hardly moved between {start:.3g} and {end:.3g}; sweep to higher rates"
        found["extend"] = [start, end * EXTEND]
    elif not diverged and rose < RISE_SHARE * fell:
        found["why"] = (f"no suggestion: the loss was still falling at {end:.3g}, the range's end (lowest at "
                        f"{lr['minimum']:.3g}), so the range holds no minimum; sweep to higher rates")
        found["extend"] = [start, end * EXTEND]
    else:
        found["suggested_lr"] = float(f"{lr['middle']:.3g}")  # as one would type it: the value the form takes
        found["why"] = curve
    return found


def valley(losses: list[float]) -> tuple[int, int, int]:
    """(first, last, suggested) indices of the loss curve's longest descent (its longest decreasing subsequence) and
    the point half-way along it, in the log-spaced rates: fastai's `valley` rule (its default since 2.5). A tenth of
    the lowest loss's rate, the older rule, trusts one point: where the loss still fell at the end of the range (SGD
    with momentum on a CPU with bf16, lowest at 10) it suggested 1, and the run reached 32% where the valley's 0.034
    reached 97.5% (docs/benchmarks.md, "The LR finder's suggestion")."""
    n = len(losses)
    longest = [1] * n
    first = last = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and longest[i] < longest[j] + 1:
                longest[i] = longest[j] + 1
        if longest[last] < longest[i]:
            last = i
            first = last - longest[last]
    third = (last - first) / 3
    return first, last, first + int(third) + int(third / 2)


def write_suggestion(config_path: str | Path, lr: float) -> float:
    """Write the suggested learning rate (3 significant digits) into the user's config file as optimizer.lr; the
    value written. The other keys are kept (comments are not: the file is YAML rewritten)."""
    import yaml

    from trainer.core.files import atomic_write_text

    path = Path(config_path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    value = float(f"{lr:.3g}")
    raw.setdefault("optimizer", {})["lr"] = value
    atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
    return value
