"""Auto (`main.py auto FOLDER --minutes N`, the Dataset page's Auto button): from a folder and a time budget to an
ordinary config, every choice with its reason.

What it looks at: the folder (classes, counts, balance, image sizes, a train/val/test layout), the machine (a GPU, the
precision the trainer's own rule picks), the pretrained weights already in the torch hub cache (Auto downloads only
when asked: `--download-weights`, or the Auto box's Download of the weights it offers for photographs), and a speed
probe: the cheapest candidate network and size measured (a few real training and validation steps at the run's batch,
precision and memory format), the others predicted from it by their operations per image, and the candidates picked
measured in turn. The first candidate, best first, that trains enough epochs in the budget (its test set and export
included) wins; the epochs are what the measured speed allows. Then a short learning-rate sweep
(`trainer.train.lr_find`), which also decodes the images into the cache the run reads. The rest is the recipe: AdamW
with a one-cycle schedule, weight decay off normalisation weights and biases, label smoothing, a weight average, flip
test-time augmentation, class weights for unbalanced classes, early stopping, a test set (the folder's own, or a
seeded stratified part of the training images held out without touching a file), and an ONNX export.

The budget is the whole: this planning time is subtracted, and the rest becomes `train.budget`, which the trainer
enforces, the test set and export inside it (`train.finish_images`). The result is a config like any other;
`auto.json` in the run keeps the choices and their reasons.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trainer.core import clock
from trainer.core.catalog import AUTO_MAX_MINUTES as MAX_MINUTES
from trainer.core.catalog import AUTO_MIN_MINUTES as MIN_MINUTES
from trainer.core.config import RunConfig
from trainer.core.errors import InputError
from trainer.data.scan import DataError, ScanResult, find_layout, scan_image_folder
from trainer.data.suggest import MULTILABEL_CROP_MIN, flip_rule, median_short_side, suggested_image_size
from trainer.device import mps
from trainer.device.machine import OtherLoad
from trainer.train.loop import score_key
from trainer.train.plan import patience_of

log = logging.getLogger(__name__)

# Pretrained networks, best first (ImageNet top-1 of their DEFAULT weights), considered when their file is cached.
PRETRAINED = ("convnext_tiny", "efficientnet_b0", "resnet50", "mobilenet_v3_large", "resnet18", "mobilenet_v3_small")
SCRATCH = ("resnet18", "resnet9", "small_cnn")  # without cached weights, best first, each from its smallest size:
SCRATCH_MIN_SIZE = {"resnet18": 96, "resnet9": 48}  # below these the network's stem leaves too little of the image
OFFERED = "resnet18"  # the ImageNet weights Auto offers to download for photographs when none are cached
PHOTO_SIDE = 96  # images whose median short side is at least this look like photographs (ImageNet's features help)
SIZES = (224, 192, 160, 128, 112, 96, 64, 48, 32)
MIN_EPOCHS = {"pretrained": 5, "scratch": 12}  # fewer than this and a smaller candidate does better
# fewer epochs than this at the images' half size (a machine busy all along, a short budget): one epoch of resnet9 at
# 112 px scored 25%, 64% and 99% in three busy runs (docs/benchmarks.md): sizes below it, down to LOWEST_SIZE, are
# candidates then, and the first (best first) that trains this many is taken
FEW_EPOCHS = 3
LOWEST_SIZE = 48
MAX_EPOCHS = 200
PLAN_SHARE = 0.25  # planning (probe + LR sweep) may take at most this share of the budget
LR_STEPS = (30, 100)  # the learning-rate sweep's steps: at least, at most
STARTUP_S = 8.0  # a trainer's own start (interpreter, torch, the cache opened, the model built)
FINISH_FIXED_S = 6.0  # the export's conversion, its runtime's start and best.pt loaded twice, on a quiet 2-core CPU
EPOCH_MARGIN = 0.9  # the epochs fill this share of the training time: speed varies
VAL_SPLIT = TEST_SPLIT = 0.15
PROBE_BUSY_ENV = "TRAINDECK_PROBE_BUSY_S"  # seconds added to each timed probe step: a busy machine, on demand
SCRATCH_ENV = "TRAINDECK_AUTO_SCRATCH"  # comma-separated networks in place of SCRATCH (bench/candidates.py measures one)
PROBE_STEPS = 3  # timed training steps per candidate (their median), after the warm-up step
BUSY_SHARE = 0.25  # other programs using this share of the CPU while Auto measures: the plan says the machine was busy
RECHECK_SPEEDUP = 1.5  # after a busy probe, a first epoch this much faster than planned measures the larger ones again
MIN_TRAIN_S = 10  # left for training after planning, at least, or Auto says the budget is too small
EARLY_STOP_MIN, EARLY_STOP_SHARE = 3, 0.33  # Auto's early stopping waits a third of the run's epochs, at least 3
POLICY = "trivial_augment"  # the augmentation policy Auto may pick (data.augment.policy), by a trial:
POLICY_MIN_EPOCHS = 50  # runs planned shorter are not tried: a policy's harder images pay back over a long run
POLICY_TRIAL_EPOCHS = 3, 0.05  # each arm of the trial trains this many epochs at least, or this share of the plan
POLICY_TRIAL_SHARE = 0.15  # the trial (both arms) takes at most this share of the time left to train
POLICY_MARGIN = 1.0  # the policy's arm must beat the arm without it by more than this (validation top-1 points)


class AutoError(InputError, ValueError):
    pass


@dataclass
class Choice:
    key: str  # a config key, or a word for what is not one (the probe)
    value: object
    why: str


@dataclass
class Measured:
    """A candidate's speeds, measured by its own probe or predicted from a measured one, and what they allow."""
    model: str
    weights: str | None
    size: int
    batch: int
    train_images_per_s: float
    eval_images_per_s: float
    epoch_s: float = 0.0
    epochs: int = 0
    how: str = "measured"  # or "predicted from NETWORK at SIZE px" (operations per image, FLOP counts)
    finish_s: float = 0.0  # the test set and the export after training, at these speeds


@dataclass
class Plan:
    config: RunConfig
    choices: list[Choice]
    probes: list[Measured] = field(default_factory=list)
    seconds: float = 0.0  # the planning's own time, taken from the budget
    offer: dict | None = None  # ImageNet weights worth downloading for this folder (`weights_offer`)

    def to_json(self) -> dict:
        return {"config": self.config.to_dict(), "choices": [asdict(c) for c in self.choices],
                "probes": [asdict(p) for p in self.probes], "planning_s": round(self.seconds, 1),
                "offer": self.offer}


def cached_weights() -> list[str]:
    """The PRETRAINED networks whose DEFAULT weights are in the torch hub cache (no network call)."""
    from trainer.model.weights import resolve

    return [name for name in PRETRAINED if resolve(name, "DEFAULT").cached]


def weights_offer(scan: ScanResult, cached: list[str] | None = None) -> dict | None:
    """The ImageNet weights to offer for `scan`'s images when no pretrained weights are cached and the images look
    like photographs (median short side at least PHOTO_SIDE px): OFFERED's DEFAULT weights, with their file, address
    and size; None otherwise (small or grey-scale-sized images gain little from ImageNet's features)."""
    from trainer.model.weights import resolve

    if (cached_weights() if cached is None else cached) or not scan.image_sizes or median_short_side(scan) < PHOTO_SIDE:
        return None
    named = resolve(OFFERED, "DEFAULT")
    return {"model": named.model, "weights": named.name, "file": str(named.file), "url": named.source,
            "megabytes": named.megabytes,
            "why": f"the images look like photographs (median short side {median_short_side(scan):.0f} px) and "
                   f"no pretrained weights are on this machine: with {named.model}'s ImageNet weights "
                   f"({named.megabytes or 0:.1f} MB) Auto fine-tunes a pretrained network instead of training "
                   f"from scratch"}


def offer_for(folder: str | os.PathLike, labels: str | None = None) -> dict | None:
    """`weights_offer` of a folder (its scan only, no probe): what `auto --download-weights` fetches first."""
    _, scan = _scan(Path(folder).expanduser(), lambda text: None, labels)
    return weights_offer(scan)


def candidate_sizes(scan: ScanResult, pretrained: bool) -> list[int]:
    """Training sizes to try, largest first: up to the images' own (median short side), down to half of it (on colour
    photographs of 200-640 px, 2 minutes from scratch, resnet9 scored 90.6% test top-1 at 128 px in 9 epochs, 77.5% at
    96 px in 14, and Auto's 64 px pick 79.4% in 23: docs/benchmarks.md, "Auto keeps its promise"), and at least 64 px
    for pretrained networks (ImageNet features need some room)."""
    native = suggested_image_size(scan) or 64
    top = max(native, 64) if pretrained else native
    low = 64 if pretrained else max(32, native // 2)
    return [s for s in SIZES if low <= s <= top] or [top]


def batch_for(size: int, cuda: bool) -> int:
    if cuda:
        return 128 if size <= 160 else 64
    return 64 if size <= 96 else 32


def measure(model_name: str, weights: str | None, size: int, batch: int, classes: int, device: torch.device,
            precision: str, reject_below: float = 0.0, steps: int = PROBE_STEPS) -> Measured:
    """Images per second of training steps (forward, backward, AdamW) and of validation batches of `model_name` at
    `size`, at the run's precision and memory format. Content does not change the speed: random images. After the
    warm-up step, a candidate slower than `reject_below` images/s is not measured further."""
    from trainer.core.config import ModelConfig
    from trainer.device.precision import autocast
    from trainer.model.models import choose_memory_format, create_model

    torch.manual_seed(0)
    net = create_model(ModelConfig(name=model_name), classes).to(device)
    memory_format = choose_memory_format("auto", model_name, net, device)
    net = net.to(memory_format=memory_format).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=memory_format)
    y = torch.randint(0, classes, (batch,), device=device)

    busy_s = float(os.environ.get(PROBE_BUSY_ENV) or 0)
    simulated = clock.simulated() is not None  # tests: the step's time is what the simulated device charges

    def train_step() -> float:
        start, start_clock = time.perf_counter(), clock.now()
        if busy_s and not clock.charge_seconds(busy_s):
            time.sleep(busy_s)  # a machine busy while Auto probes (tests, benchmarks): the probe reads it slow
        with autocast(precision, device.type):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the step is done when its loss is read (a GPU runs ahead otherwise)
        clock.charge_images(model_name, batch, size, size)
        return clock.now() - start_clock if simulated else time.perf_counter() - start

    first = train_step()
    if reject_below and batch / first < reject_below / 3:  # the warm-up step is slower, but not 3x
        return Measured(model_name, weights, size, batch, batch / first, batch / first)
    train_s = statistics.median(train_step() for _ in range(steps))
    net.eval()
    with torch.inference_mode(), autocast(precision, device.type):
        net(x)
        start, start_clock = time.perf_counter(), clock.now()
        net(x).float().sum().item()
        clock.charge_images(model_name, batch, size, size, evaluating=True)
        eval_s = clock.now() - start_clock if simulated else time.perf_counter() - start
    return Measured(model_name, weights, size, batch, batch / train_s, batch / eval_s)


def epoch_seconds(m: Measured, train_images: int, val_images: int, tta: bool) -> float:
    return train_images / m.train_images_per_s + val_images * (2 if tta else 1) / m.eval_images_per_s + 0.5


def finish_images(test_images: int, tta: bool) -> int:
    """What comes after training, in validation images: the test set (twice with flip TTA), the export's accuracy
    check (the export on the test set; the checkpoint's classes are the test set's own predictions.csv) and its speed
    measurement (export_measure's warm-up and minimum timed runs, at batch 1 and at its throughput batch, for both),
    and FINISH_FIXED_S of conversion and start at the probe's speed. The trainer keeps its time inside the budget
    (train.finish_images) at the speed it measures."""
    from trainer.deploy.export_measure import LARGE_BATCH, MIN_BATCH_RUNS, MIN_TIMED_RUNS, WARM_UP

    timing = 2 * ((WARM_UP[0] + MIN_TIMED_RUNS) + (WARM_UP[1] + MIN_BATCH_RUNS) * LARGE_BATCH)
    return test_images * (2 if tta else 1) + test_images + timing


def finish_seconds(m: Measured, test_images: int, tta: bool) -> float:
    """The test set and the export of candidate `m`, predicted from its validation speed."""
    from trainer.deploy.export_measure import LATENCY_SECONDS, THROUGHPUT_SECONDS

    bounded = 2 * (LATENCY_SECONDS + THROUGHPUT_SECONDS)  # the timings' own time limits, checkpoint and export
    return finish_images(test_images, tta) / m.eval_images_per_s + bounded + FINISH_FIXED_S


@functools.lru_cache(maxsize=256)
def operations(model_name: str, size: int, classes: int) -> float:
    """Floating-point operations of one image's forward pass of `model_name` at `size` px, counted on the meta
    device (no memory, no arithmetic); NaN for a network they cannot be counted of (it is then only measured)."""
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.core.config import ModelConfig
    from trainer.model.models import create_model

    try:
        with torch.device("meta"):
            net = create_model(ModelConfig(name=model_name), classes).eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            net(torch.empty(1, 3, size, size, device="meta"))
        return float(counter.get_total_flops()) or math.nan
    except Exception as e:  # noqa: BLE001 - an operation the meta device lacks: this one is measured, not predicted
        log.info("auto: %s at %d px: operations not counted (%s)", model_name, size, e)
        return math.nan


def predict(name: str, weights: str | None, size: int, batch: int, classes: int,
            measured: list[Measured]) -> Measured | None:
    """A candidate's speeds from a measured one, in inverse proportion to the operations per image: its own network
    at the size nearest in operations when it has been measured, else the measured network nearest in operations
    (a network's speed per operation differs more between networks than between sizes). None when its operations
    cannot be counted."""
    ops = operations(name, size, classes)
    known = [m for m in measured if math.isfinite(operations(m.model, m.size, classes))]
    pool = [m for m in known if m.model == name] or known
    if not math.isfinite(ops) or not pool:
        return None
    ref = min(pool, key=lambda m: abs(math.log(operations(m.model, m.size, classes) / ops)))
    ratio = operations(ref.model, ref.size, classes) / ops
    return Measured(name, weights, size, batch, ref.train_images_per_s * ratio, ref.eval_images_per_s * ratio,
                    how=f"predicted from {ref.model} at {ref.size} px")


def epochs_in(left_s: float, epoch_s: float) -> int:
    """The epochs a run started with `left_s` seconds left plans, at `epoch_s` each (its start and a margin off)."""
    return max(0, min(MAX_EPOCHS, int((left_s - STARTUP_S) * EPOCH_MARGIN // epoch_s)))


def plan(folder: str | os.PathLike, minutes: float, *, progress: Callable[[str], None] | None = None,
         started: float | None = None, overrides: list[str] | None = None,
         faster_than: tuple[str, int, str] | None = None, recheck_of: tuple[str, int, str] | None = None,
         labels: str | None = None) -> Plan:
    """The config Auto chooses for `folder` within `minutes` (this planning's time included), and why.
    `faster_than` (network, size, why): a run of that network at that size turned out too slow in its first epoch;
    only the candidates after it (smaller sizes, then faster networks) are considered. `recheck_of`: it turned out
    faster than measured (the machine was busy while Auto measured): all the candidates, best first, as the machine
    is now (a larger one may fit now, or, where the busy probe fell back on the one with the most epochs, a smaller).
    With `labels` (a labels file), a multi-label run of the images it lists."""
    started = started or clock.now()
    # a trainer's own start (the interpreter, its imports) comes before its budget's clock: as long as this
    # command's took on this machine now (0 when planning is called inside a running process)
    trainer_start_s = clock.now() - started
    say = progress or (lambda text: None)
    if not math.isfinite(minutes) or not MIN_MINUTES <= minutes <= MAX_MINUTES:
        raise AutoError(f"--minutes: give a number of minutes from {MIN_MINUTES:g} to {MAX_MINUTES:g}, got {minutes:g}")
    layout, scan = _scan(Path(folder).expanduser(), say, labels)
    choices: list[Choice] = []

    def choose(key: str, value, why: str) -> None:
        choices.append(Choice(key, value, why))

    budget_s = minutes * 60
    train_images, val_images, test_images = _split_choices(layout, scan, choose)
    device, precision = _device_choices(choose)
    cuda = device.type == "cuda"
    cached = cached_weights()
    kind = "pretrained" if cached else "scratch"
    flips, why_flips = flip_rule(scan)
    tta = flips
    if cached:
        candidates = [(name, "DEFAULT") for name in cached]
        why_kind = f"ImageNet weights in the cache for {', '.join(cached)}"
    else:
        candidates = [(name, None) for name in (os.environ.get(SCRATCH_ENV) or ",".join(SCRATCH)).split(",")]
        why_kind = "no pretrained weights in the torch hub cache: from scratch"
    sizes = candidate_sizes(scan, bool(cached))
    below = [] if cached else [s for s in SIZES if LOWEST_SIZE <= s < min(sizes)]  # only when the sizes leave too few
    order = [(name, weights, size) for group in (sizes, below) for name, weights in candidates for size in group
             if weights or size >= SCRATCH_MIN_SIZE.get(name, 0)]  # best first: the usual sizes, then those below
    again = faster_than or recheck_of  # measured again after a first epoch: once only
    if faster_than:
        tried = [i for i, (name, _, size) in enumerate(order) if (name, size) == faster_than[:2]]
        order = order[tried[0] + 1:] if tried else order
        if not order:
            raise AutoError(f"no network faster than {faster_than[0]} at {faster_than[1]} px to go on with")
    need = MIN_EPOCHS[kind]
    train_s = budget_s * (1 - PLAN_SHARE) - STARTUP_S
    load = OtherLoad()
    images = (train_images, val_images, test_images, len(scan.classes))
    chosen, probes = _probe(order, need, min(sizes), train_s, images, tta, device, precision,
                            lambda: clock.now() - started > budget_s * PLAN_SHARE * 0.6, say)
    others = load.share()
    how_busy = _how_busy(others)
    reason = f"{why_kind}; {_model_reason(probes, chosen, need, min(sizes))}"
    if again:
        reason += f"; measured again because {again[2]}"
    choose("model.name", chosen.model, reason)
    offer = weights_offer(scan, cached)
    if chosen.weights:
        choose("model.weights", chosen.weights, f"{chosen.model}'s ImageNet weights, found in the cache")
    elif offer:
        say(f"{offer['why']}: `main.py fetch-weights {offer['model']}` (or `auto --download-weights`) downloads them")
        choose("model.weights", None, f"from scratch: {offer['why']}; download them (`main.py auto ... "
                                      f"--download-weights`, `main.py fetch-weights {offer['model']}`, or the Auto "
                                      f"box's Download) and Auto plans with them")
    median = median_short_side(scan) if scan.image_sizes else 0
    choose("data.image_size", chosen.size, f"images' median short side {median:.0f} px; " + (
        f"the largest size of {', '.join(map(str, sizes))} at which {chosen.model} trains {need} epochs"
        if chosen.epochs >= need else f"the size of {', '.join(map(str, sizes))} at which a candidate trains the "
                                      f"most epochs" if chosen.size >= min(sizes) else
        f"below the images' half size ({min(sizes)} px), where no candidate trains {FEW_EPOCHS} epochs: the largest "
        f"at which {chosen.model} does"))
    choose("data.batch_size", chosen.batch, "what this device trains well at this size" + ("" if cuda else
                                                                                             " on a CPU"))
    raw = _recipe(layout, scan, chosen, bool(cached), (flips, why_flips), device, choose)
    cfg = RunConfig.from_dict(raw, source="auto")
    # the learning rate: a short sweep, which also decodes the images into the cache the run will read
    sweep_s = max(0.0, budget_s * PLAN_SHARE - (clock.now() - started))
    step_s = chosen.batch / chosen.train_images_per_s
    steps = int(min(LR_STEPS[1], sweep_s / max(step_s, 1e-3) * 0.5))
    lr, why_lr = 1e-3, "AdamW's usual 1e-3 (no time for a learning-rate sweep in this budget)"
    if steps >= LR_STEPS[0]:
        say(f"finding the learning rate ({steps} steps)")
        lr, why_lr = sweep_lr(cfg, steps)
    cfg.optimizer.lr = lr
    choose("optimizer.lr", float(f"{lr:.3g}"), why_lr)

    if labels:
        choose("data.augment.policy", "none", "multi-label: a policy's shears, rotations and shifts can move a labelled "
                                              "thing out of view, and its label with it")
    else:
        _policy_choice(cfg, chosen, budget_s - (clock.now() - started) - chosen.finish_s, say, choose)
    spent = clock.now() - started
    left_s = budget_s - spent
    if left_s < MIN_TRAIN_S:
        raise AutoError(f"--minutes {minutes:g}: planning took {spent:.0f} s (the folder's scan and one speed probe), "
                        f"which leaves nothing to train in; give more minutes")
    whole = epochs_in(left_s - chosen.finish_s, chosen.epoch_s)
    epochs = max(1, whole)
    cfg.train.epochs = epochs
    choose("train.epochs", epochs, f"{left_s / 60:.1f} min left after planning, {chosen.finish_s:.0f} s of it kept "
                                   f"for the test set and the export, {chosen.epoch_s:.1f} s per epoch {chosen.how} "
                                   f"({train_images} training images at {chosen.train_images_per_s:.0f}/s, "
                                   f"{val_images} validation images{' twice (flip)' if tta else ''})"
                                   + ("" if whole else ": no whole epoch fits, so one, cut short by the budget")
                                   + how_busy)
    cfg.train.budget = round((left_s - trainer_start_s) / 60, 2)
    cfg.train.finish_images = round(chosen.finish_s * chosen.eval_images_per_s)
    choose("train.finish_images", cfg.train.finish_images,
           f"the test set ({test_images} images{', twice (flip)' if tta else ''}) and the ONNX export (its accuracy "
           f"on the test set and its timed batches) come inside the budget: {chosen.finish_s:.0f} s predicted at "
           f"{chosen.eval_images_per_s:.0f} validation images/s; the trainer ends training that many validation "
           f"images' time before the budget's end, at the speed it measures")
    cfg.train.replan = True
    choose("train.replan", True, "the epochs above come from a short probe: after each epoch the trainer re-plans "
                                 "them from the speed it measures, so the run fills its budget whatever the machine "
                                 "is doing, with the schedule's annealing completed")
    after = [m for m in probes[probes.index(chosen) + 1:] if m.size >= min(sizes) or chosen.size < min(sizes)]
    faster = max(after or [chosen], key=lambda m: m.train_images_per_s)  # (below the floor only from below it)
    faster_left = faster.train_images_per_s > chosen.train_images_per_s  # whatever the probe found fits
    least = need if chosen.size >= min(sizes) else FEW_EPOCHS  # what the pick was made for
    cfg.train.min_epochs = least if faster_left and not again else 0
    choose("train.min_epochs", cfg.train.min_epochs,
           "off: Auto has measured again once already; this run re-plans its epochs and goes on" if again else
           f"if the first epoch shows fewer than {least} epochs fit (the machine got slower than the probe measured), "
           f"the run ends there and Auto measures the faster candidates again for the time left (the fastest: "
           f"{faster.model} at {faster.size} px, {faster.train_images_per_s:.0f} images/s {faster.how})"
           if faster_left else "off: no faster candidate is left to go on with")
    _recheck_choice(cfg, probes, chosen, need, others >= BUSY_SHARE, bool(again), choose)
    choose("train.budget", cfg.train.budget, f"{minutes:g} min in all, less {spent:.0f} s of planning and "
                                             f"{trainer_start_s:.0f} s for the trainer's own start (as long as this "
                                             f"command's): the trainer ends there whatever happens, the test set and "
                                             f"the export included (train.finish_images)")
    steps_total = epochs * math.ceil(train_images / chosen.batch)
    if steps_total >= 100:
        cfg.train.ema = round(min(0.9998, max(0.9, 1 - 10 / steps_total)), 4)
        choose("train.ema", cfg.train.ema, f"a weight average over about the last {steps_total // 10} of the "
                                           f"{steps_total} steps; validated, checkpointed and exported")
    else:
        choose("train.ema", 0.0, f"only {steps_total} steps: too few to average")
    es = cfg.train.early_stop
    es.metric, es.share, es.patience = score_key(bool(labels)), EARLY_STOP_SHARE, EARLY_STOP_MIN
    es.patience = patience_of(es, epochs)  # a third of the plan: a re-plan lengthens it, never shortens it
    watched = "validation mAP" if labels else "validation accuracy"
    choose("train.early_stop.metric", es.metric, f"{watched}: what the best epoch is chosen by")
    choose("train.early_stop.patience", es.patience, f"stop when {watched} has not improved for "
                                                     f"{es.patience} epochs (a third of the planned run, at least "
                                                     f"{EARLY_STOP_MIN})")
    choose("train.early_stop.share", es.share, "a run the trainer re-plans longer waits a third of its new length; "
                                               "one re-planned shorter keeps the wait planned here (a slower machine "
                                               "is not a reason to give up sooner)")
    choose("train.progressive_resize", 0.0, "off: with few epochs, a changing size makes each epoch's time less "
                                            "predictable, and the budget is the rule")
    choose("export.formats", ["onnx"], "an ONNX file of best.pt, for any runtime")
    cfg, choices = _with_overrides(cfg, choices, overrides or [])
    return Plan(RunConfig.from_dict(cfg.to_dict(), source="auto"), choices, probes, clock.now() - started, offer)


def trained_as_one_run(plan: dict, by: str) -> dict:
    """A plan (`Plan.to_json()`) that `by` (the app, a run on a host) trains as one ordinary run, where nobody would go
    on with another network: train.min_epochs and train.recheck_epochs off, said in their choices (the run still
    re-plans its epochs)."""
    why = f"off: {by} trains this plan as one run, which re-plans its epochs (train.replan) but does not go on with " \
          f"another network"
    keys = ("train.min_epochs", "train.recheck_epochs")
    for key in keys:
        plan["config"]["train"][key.split(".")[1]] = 0
    plan["choices"] = [c for c in plan["choices"] if c["key"] not in keys] + [
        {"key": key, "value": 0, "why": why} for key in keys]
    return plan


def _recheck_choice(cfg: RunConfig, probes: list[Measured], chosen: Measured, need: int, busy: bool, again: bool,
                    choose: Callable) -> None:
    """train.recheck_epochs: a probe on a busy machine reads every candidate slow: it may have passed over a larger
    one that the machine, once quiet, trains enough epochs of, or, finding none that fit, fallen back on the one with
    the most epochs. When the first epoch shows that many epochs fit, the run makes way and Auto measures the
    candidates again, best first (once): at least RECHECK_SPEEDUP times the planned epochs, and as many as show that
    the best candidate passed over would now train `need` (a speed-up short of that would only measure again and
    choose the same: on a busy laptop that cost 13 s of a 2-minute budget)."""
    larger = probes[:probes.index(chosen)]
    on = busy and not again and bool(larger)
    if on:
        enough = need * larger[-1].epoch_s / max(chosen.epoch_s, 1e-9)  # the chosen's epochs at that speed-up
        cfg.train.recheck_epochs = max(math.ceil(cfg.train.epochs * RECHECK_SPEEDUP), math.ceil(enough))
    else:
        cfg.train.recheck_epochs = 0
    passed = f" ({'..., ' if len(larger) > 4 else ''}{', '.join(f'{p.model} at {p.size} px' for p in larger[-4:])} " \
             f"passed over)" if larger else ""
    choose("train.recheck_epochs", cfg.train.recheck_epochs,
           "off: Auto has measured again once already" if again else
           "off: the machine was quiet while Auto measured" if not busy else
           "off: no larger candidate was passed over" if not on else
           f"the machine was busy while Auto measured: if the first epoch shows at least {cfg.train.recheck_epochs} "
           f"epochs fit (at least {RECHECK_SPEEDUP:g}x the plan, and enough for {larger[-1].model} at "
           f"{larger[-1].size} px to train {need}), the run ends there and Auto measures the candidates again, best "
           f"first, for the time left{passed}")


def _how_busy(others: float) -> str:
    """What the plan says of the machine while the probe measured (its speeds read low when it was busy)."""
    if others >= BUSY_SHARE:
        return (f"; the machine was busy while Auto measured (other programs used {others:.0%} of the CPU), so these "
                f"speeds read low: the trainer re-plans the epochs from the speed it measures (train.replan)")
    return (f"; the median of {PROBE_STEPS} timed steps after a warm-up step, other programs using {others:.0%} of "
            f"the CPU meanwhile")


def _scan(root: Path, say: Callable[[str], None], labels: str | None = None) -> tuple[dict, ScanResult]:
    """The folder's own splits (`find_layout`) and the scan of its training images; AutoError for an unusable one.
    Multi-label: the images `labels` lists in `root`, a sample of their sizes read."""
    if not root.is_dir():
        raise AutoError(f"{root}: no such folder (give an ImageFolder: one sub-folder of images per class)")
    root = root.resolve()  # the plan's config is read from its run directory, against which a relative path would go
    if labels:
        from trainer.data.labels import labelled_scan

        say(f"reading {labels}")
        labels = str(Path(labels).expanduser().resolve())
        scan = labelled_scan(labels, "--labels", str(root))
        scan.image_sizes = image_sizes([path for path, _ in scan.samples])
        return {"train_dir": str(root), "val_dir": None, "test_dir": None, "labels": labels}, scan
    layout = find_layout(root)
    say(f"scanning {layout['train_dir']}")
    try:
        scan = scan_image_folder(layout["train_dir"], full=False)
    except DataError as e:
        raise AutoError(str(e)) from e
    problems = scan.problems()
    if problems:
        raise AutoError(problems[0])
    return layout, scan


def image_sizes(paths: list[str], sample: int = 300) -> list[tuple[int, int]]:
    """(width, height) of a seeded sample of `paths`, from their headers."""
    from PIL import Image

    from trainer.data.scan import open_image

    sizes = []
    for path in sorted(random.Random(0).sample(paths, min(sample, len(paths)))):
        try:
            with open_image(path) as image:
                sizes.append(image.size)
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
    return sizes


def _split_choices(layout: dict, scan: ScanResult, choose: Callable) -> tuple[int, int, int]:
    """The folder's splits as choices (its own test/ and val/, else seeded held-out shares); the images each gets
    (training, validation, test)."""
    n = len(scan.samples)
    choose("data.train_dir", layout["train_dir"], f"{len(scan.classes)} classes, {n} images"
           + (" (the folder's own train/ split)" if layout["val_dir"] or layout["test_dir"] else ""))
    if layout.get("labels"):
        choose("data.labels", layout["labels"], f"multi-label: {len(scan.classes)} labels on {n} images "
                                                 f"(held-out shares drawn at random, not by class)")
    if layout["test_dir"]:
        choose("data.test_dir", layout["test_dir"], "the folder has a test/ split: evaluated once at the end")
        test_share = 0.0
    else:
        test_share = TEST_SPLIT
        each = "of the images" if layout.get("labels") else "of each class"
        choose("data.test_split", TEST_SPLIT, f"no test folder: {TEST_SPLIT:.0%} {each} is held out "
                                              f"(seeded; the files stay where they are) and evaluated once at the end")
    if layout["val_dir"]:
        choose("data.val_dir", layout["val_dir"], "the folder has a val/ split")
        train_images, val_images = int(n * (1 - test_share)), None
    else:
        choose("data.val_split", VAL_SPLIT, f"{VAL_SPLIT:.0%} of the rest validates each epoch"
               + ("" if layout.get("labels") else " (stratified)"))
        train_images = int(n * (1 - test_share) * (1 - VAL_SPLIT))
        val_images = int(n * (1 - test_share) * VAL_SPLIT)
    if val_images is None:
        val_images = len(scan_image_folder(layout["val_dir"], full=False).samples)
    test_images = len(scan_image_folder(layout["test_dir"], full=False).samples) if layout["test_dir"] else \
        round(n * test_share)

    return train_images, val_images, test_images


def _device_choices(choose: Callable) -> tuple[torch.device, str]:
    """One GPU when there is one (an NVIDIA GPU, else Apple's), else the CPU; the precision the trainer picks on it."""
    cuda = torch.cuda.is_available()
    on_mps = not cuda and mps.facts()["mps"]
    device = torch.device("cuda", 0) if cuda else torch.device("mps") if on_mps else torch.device("cpu")
    if cuda:
        props = torch.cuda.get_device_properties(0)
        choose("device.type", "cuda", f"{props.name} ({props.total_memory / 2**30:.0f} GB); one GPU")
    elif on_mps:
        choose("device.type", "mps", "Apple silicon's GPU (MPS); no CUDA GPU here")
    else:
        from trainer.data.loader import usable_cpus

        choose("device.type", "cpu", f"no CUDA GPU here; {usable_cpus()} CPU cores")
    from trainer.device.precision import choose_precision

    precision, precision_why = choose_precision("auto", device)
    choose("train.amp", "auto", f"{precision}: {precision_why.removeprefix('auto: ')}")

    return device, precision


def _pick(rows: list[Measured], need: int, floor: int) -> tuple[Measured, bool]:
    """The candidate to train, and whether it trains `need` epochs: among those at `floor` px or more, the first
    that trains `need`, else the one that trains the most (the fastest of those), when that is FEW_EPOCHS or more;
    else the first of all (those below the floor included) that trains FEW_EPOCHS, else the one that trains the most."""
    usual = [m for m in rows if m.size >= floor] or rows
    fits = [m for m in usual if m.epochs >= need]
    if fits:
        return fits[0], True
    most = max(usual, key=lambda m: (m.epochs, m.train_images_per_s))  # ties: the fastest
    if most.epochs >= FEW_EPOCHS:
        return most, False
    few = [m for m in rows if m.epochs >= FEW_EPOCHS]
    return (few[0] if few else max(rows, key=lambda m: (m.epochs, m.train_images_per_s))), False


def _probe(order: list[tuple[str, str | None, int]], need: int, floor: int, train_s: float,
           images: tuple[int, int, int, int], tta: bool, device: torch.device, precision: str,
           out_of_time: Callable[[], bool], say: Callable[[str], None]) -> tuple[Measured, list[Measured]]:
    """Every (network, weights, size) candidate in `order` (best first: the best networks first, each at its sizes
    largest first, then the sizes below `floor`) measured or predicted, and the one to train (`_pick`): the first that
    trains `need` epochs in `train_s` (its test set and export taken out), else the one that trains the most.

    The cheapest candidate (fewest operations per image) is measured first: quick even on a busy machine, and a
    measure of this machine as it is now. The others are predicted from it by their operations per image, and the
    best one predicted to fit is measured in turn, which corrects the predictions of its network (the speed per
    operation of a network is what differs); the first one that both is picked and has been measured is the answer,
    once the candidate just before it (the best passed over, predicted not to fit) has been measured too.
    When the probe's time is used up (`out_of_time`), the pick stands on its prediction (the trainer re-plans from its
    own first epoch)."""
    train_images, val_images, test_images, classes = images
    cuda = device.type == "cuda"
    measured: dict[tuple[str, int], Measured] = {}

    def allows(m: Measured) -> Measured:
        m.finish_s = finish_seconds(m, test_images, tta)
        m.epoch_s = epoch_seconds(m, train_images, val_images, tta)
        m.epochs = max(0, int((train_s - m.finish_s) * EPOCH_MARGIN // m.epoch_s))
        return m

    def table() -> list[Measured]:
        rows = []
        for name, weights, size in order:
            m = measured.get((name, size)) or predict(name, weights, size, batch_for(size, cuda), classes,
                                                      list(measured.values()))
            if m is not None:
                rows.append(allows(m))
        return rows

    def take(name: str, weights: str | None, size: int) -> None:
        floor = train_images * need / max(train_s, 1.0)  # the slowest speed that still trains `need` epochs
        say(f"measuring {name} at {size} px")
        m = allows(measure(name, weights, size, batch_for(size, cuda), classes, device, precision,
                           reject_below=floor))
        measured[(name, size)] = m
        log.info("auto probe: %s at %d px, batch %d: %.0f images/s training, %.0f validating -> %d epochs",
                 name, size, m.batch, m.train_images_per_s, m.eval_images_per_s, m.epochs)

    counted = [c for c in order if math.isfinite(operations(c[0], c[2], classes))]
    take(*min(counted, key=lambda c: operations(c[0], c[2], classes)) if counted else order[-1])
    while True:
        rows = table()
        pick, fits = _pick(rows, need, floor)
        if out_of_time():
            break
        if pick.how != "measured":
            take(pick.model, pick.weights, pick.size)
            continue
        before = rows[rows.index(pick) - 1] if fits and rows.index(pick) else None
        if before is None or before.how == "measured":
            break
        take(before.model, before.weights, before.size)  # the check: the best passed over, predicted not to fit
    for m in rows:
        if m.how != "measured":
            log.info("auto probe: %s at %d px %s: %.0f images/s training -> %d epochs", m.model, m.size, m.how,
                     m.train_images_per_s, m.epochs)
    return pick, rows


def _model_reason(rows: list[Measured], chosen: Measured, need: int, floor: int) -> str:
    """Why `chosen`: every candidate's epochs are in the plan's probes (auto.json); the reason names the network's
    rule and the candidates passed over (at most four), each with the figure it was judged by."""
    names = ", ".join(dict.fromkeys(m.model for m in rows))
    said = f"{chosen.model} at {chosen.size} px: {chosen.epochs} epochs at {chosen.train_images_per_s:.0f} images/s " \
           f"{chosen.how}"
    passed = rows[:rows.index(chosen)]
    over = "; ".join(f"{m.model} at {m.size} px {m.epochs}" for m in passed[-4:])
    over = f" (passed over, epochs: {'...; ' if len(passed) > 4 else ''}{over})" if passed else ""
    if chosen.size < floor:
        best = max((m for m in rows if m.size >= floor), key=lambda m: (m.epochs, m.train_images_per_s))
        return (f"at the images' half size ({floor} px) and above, none of {len(rows)} candidates ({names}, measured "
                f"or predicted) trains {FEW_EPOCHS} epochs in the budget (the most: {best.model} at {best.size} px, "
                f"{best.epochs}): below it, the first that does, {said}")
    if chosen.epochs >= need:
        return (f"the first of {len(rows)} candidates ({names}, best first, each at its sizes largest first) that "
                f"trains at least {need} epochs in the budget, test set and export included: {said}{over}")
    return (f"none of {len(rows)} candidates ({names}, measured or predicted) trains {need} epochs in the budget, "
            f"test set and export included: the one that trains the most, {said}")


def _recipe(layout: dict, scan: ScanResult, chosen: Measured, pretrained: bool, flip_rule_said: tuple[bool, str],
            device: torch.device, choose: Callable) -> dict:
    """The config of the chosen network: the folder's splits, augmentation, loss, AdamW with one-cycle, flip
    test-time augmentation, the ONNX export; each ingredient a choice with its reason."""
    flips, why_flips = flip_rule_said
    tta = flips
    counts = scan.counts
    raw = {
        "data": {**{k: v for k, v in layout.items() if v}, "image_size": chosen.size, "batch_size": chosen.batch,
                 "augment": {"hflip": flips, "random_resized_crop": True,
                             "crop_scale_min": MULTILABEL_CROP_MIN if scan.labels_file else 0.35 if pretrained else 0.5,
                             "color_jitter": 0.0}},
        "model": {"name": chosen.model, "weights": chosen.weights},
        "loss": {"label_smoothing": 0.1, "class_weights": "auto" if scan.unbalanced else "none"} if not
        scan.labels_file else {"name": "asl", "label_smoothing": 0.0, "class_weights": "none"},
        "optimizer": {"name": "adamw", "weight_decay": 0.05, "norm_weight_decay": 0.0},
        "scheduler": {"name": "onecycle"},
        "train": {"amp": "auto", "seed": 0},
        "eval": {"tta": tta},
        "export": {"formats": ["onnx"]},
        "device": {"type": device.type, "gpus": [0]},
    }
    if not layout["test_dir"]:
        raw["data"]["test_split"] = TEST_SPLIT
    if not layout["val_dir"]:
        raw["data"]["val_split"] = VAL_SPLIT
    choose("data.augment.hflip", flips, why_flips)
    choose("data.augment.crop_scale_min", raw["data"]["augment"]["crop_scale_min"],
           "multi-label: a crop keeps most of the image, so the labelled things stay in view" if scan.labels_file else
           "random crops of at least this share of the image: milder than ImageNet's 0.08 for a short run")
    smallest, largest = min(counts.values()), max(counts.values())
    if scan.labels_file:
        choose("loss.name", "asl", "multi-label: the asymmetric loss (easy negatives count for little); measured "
                                   "above bce, weighted or not, on real images with 1-4 labels each "
                                   "(docs/benchmarks.md, \"Multi-label loss\")")
        choose("loss.class_weights", "none", f"labels on {smallest} to {largest} images: asl weighs positives and "
                                             f"negatives itself")
        choose("loss.label_smoothing", 0.0, "off: a label's targets stay 0 and 1, on which its threshold is chosen")
    else:
        choose("loss.class_weights", raw["loss"]["class_weights"],
               f"classes from {smallest} to {largest} images: " + ("rarer classes weigh more" if scan.unbalanced
                                                                  else "balanced enough"))
        choose("loss.label_smoothing", 0.1, "torchvision's and timm's recipes: less over-confident, better "
                                            "calibrated")
    choose("optimizer.name", "adamw", "one optimizer that suits every candidate network, with a one-cycle schedule")
    choose("optimizer.norm_weight_decay", 0.0, "no weight decay on normalisation weights and biases (torchvision, "
                                               "timm)")
    choose("scheduler.name", "onecycle", "warm-up over 30% of the steps, then cosine annealing: fastai's "
                                         "fit_one_cycle; fits a fixed number of epochs")
    choose("eval.tta", tta, "flip test-time augmentation: the mean of the image's and its mirror's logits"
           if tta else f"no mirror images: {why_flips}")

    return raw


def _with_overrides(cfg: RunConfig, choices: list[Choice], overrides: list[str]) -> tuple[RunConfig, list[Choice]]:
    """The user's `--set` values, last: applied, and listed as theirs in place of Auto's choice of the same key."""
    cfg = cfg.with_overrides(overrides) if overrides else cfg
    for item in overrides:
        key, _, _ = item.partition("=")
        node = cfg.to_dict()
        for part in key.strip().split("."):
            node = node[part]
        choices = [c for c in choices if c.key != key.strip()]
        choices.append(Choice(key.strip(), node, "set by you (--set)"))
    return cfg, choices


def _policy_choice(cfg: RunConfig, chosen: Measured, left_s: float, say: Callable, choose: Callable) -> None:
    """data.augment.policy: POLICY only where a trial measured that it helps. Two short runs of the chosen config,
    the same seed, with and without it, each its own short schedule; the policy is kept when its run's best validation
    top-1 is more than POLICY_MARGIN points higher. A short trial favours no policy (harder images pay back later), so
    what it keeps helped already; it is made only for runs planned at least POLICY_MIN_EPOCHS long, and takes at most
    POLICY_TRIAL_SHARE of the time left."""
    planned = epochs_in(left_s, chosen.epoch_s)
    fits = int((left_s * POLICY_TRIAL_SHARE / 2 - STARTUP_S) // chosen.epoch_s)  # epochs an arm has time for
    arm_epochs = min(fits, max(POLICY_TRIAL_EPOCHS[0], round(planned * POLICY_TRIAL_EPOCHS[1])))
    trial_s = 2 * (STARTUP_S + arm_epochs * chosen.epoch_s)
    if planned < POLICY_MIN_EPOCHS or arm_epochs < POLICY_TRIAL_EPOCHS[0]:
        choose("data.augment.policy", "none", f"not tried: a policy pays back over long runs, and {planned} epochs "
                                              f"are planned (a trial needs at least {POLICY_MIN_EPOCHS})"
               if planned < POLICY_MIN_EPOCHS else f"not tried: a trial of {POLICY_TRIAL_EPOCHS[0]} epochs with it "
                                                   f"and without would take over {POLICY_TRIAL_SHARE:.0%} of the "
                                                   f"time left")
        return
    say(f"trying {POLICY} against no policy ({arm_epochs} epochs each)")
    scores = {policy: trial_score(cfg, policy, arm_epochs, timeout_s=3 * trial_s) for policy in ("none", POLICY)}
    if None in scores.values():
        choose("data.augment.policy", "none", f"the trial of {POLICY} did not finish (see the log)")
        return
    gain = 100 * (scores[POLICY] - scores["none"])
    cfg.data.augment.policy = POLICY if gain > POLICY_MARGIN else "none"
    measured = (f"best validation top-1 after {arm_epochs} epochs each: {100 * scores[POLICY]:.1f}% with {POLICY}, "
                f"{100 * scores['none']:.1f}% without")
    choose("data.augment.policy", cfg.data.augment.policy,
           f"measured to help: {measured}" if gain > POLICY_MARGIN else
           f"not measured to help by more than {POLICY_MARGIN:g} point: {measured}")


def trial_score(cfg: RunConfig, policy: str, epochs: int, timeout_s: float) -> float | None:
    """The best validation top-1 of `cfg` trained `epochs` epochs with `data.augment.policy` = `policy` (no budget,
    early stopping, weight average or export), in a throw-away run directory by a trainer process of its own; None if
    it did not complete within `timeout_s`."""
    from trainer.runs.launch import worker_module_args
    from trainer.runs.prepare import prepare_run

    arm = RunConfig.from_dict(cfg.to_dict())
    arm.data.augment.policy = policy
    arm.train.epochs, arm.train.budget, arm.train.replan, arm.train.ema = epochs, 0.0, False, 0.0
    arm.train.min_epochs = arm.train.recheck_epochs = arm.train.early_stop.patience = 0
    arm.export.formats = []
    with tempfile.TemporaryDirectory(prefix="traindeck-auto-") as tmp:
        run, lock = prepare_run(arm, runs_dir=tmp, label=f"trial-{policy}")
        lock.close()
        try:
            done = subprocess.run([sys.executable, *worker_module_args(run.path, False)], timeout=timeout_s,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            log.warning("auto: the %s trial ran past %.0f s", policy, timeout_s)
            return None
        status = run.read_status()
        if done.returncode or status.get("state") != "completed" or status.get("best_acc") is None:
            log.warning("auto: the %s trial ended %s: %s", policy, status.get("state"), done.stderr[-2000:])
            return None
        return float(status["best_acc"])


def sweep_lr(cfg: RunConfig, steps: int) -> tuple[float, str]:
    """(lr, why) from `trainer.train.lr_find` on a copy of `cfg`, clamped to what AdamW tolerates."""
    from trainer.core.rundir import RunDir
    from trainer.train.lr_find import LrFindError, find_lr

    probe = RunConfig.from_dict(cfg.to_dict())
    with tempfile.TemporaryDirectory(prefix="traindeck-auto-") as tmp:
        try:
            found = find_lr(probe, RunDir(tmp), steps=steps, start=1e-6, end=1.0)
        except LrFindError as e:
            return 1e-3, f"AdamW's usual 1e-3 (the sweep could not suggest one: {e})"
    if found["suggested_lr"] is None:  # no minimum inside the swept range
        return 1e-3, f"AdamW's usual 1e-3 (the learning-rate sweep of {len(found['lrs'])} steps suggested none: " \
                     f"{found['why'].removeprefix('no suggestion: ')})"
    lr = min(3e-3, max(1e-5, found["suggested_lr"]))
    clamp = "" if lr == found["suggested_lr"] else f", kept within 1e-5..3e-3 (suggested {found['suggested_lr']:.3g})"
    return lr, f"learning-rate sweep of {len(found['lrs'])} steps: {found['suggested_lr']:.3g}, {found['why']}{clamp}"
