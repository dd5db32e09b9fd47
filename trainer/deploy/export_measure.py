"""What an exported file is worth: its top-1 and its agreement with the checkpoint on the run's own images, and its
latency and throughput in its own runtime on this machine.

The reference is the checkpoint's network in fp32, the very network that was exported, so `agreement` (the share of
images given the same class) shows what the format itself changed: nothing for fp32 graphs, the cost of int8 or
fp16 for the smaller files.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from trainer.data.frame import Frame
from trainer.deploy.evaluation import top_classes
from trainer.deploy.export_data import MeasureSet
from trainer.deploy.inference import BATCH, LoadedModel

log = logging.getLogger(__name__)

LARGE_BATCH = 32  # the throughput batch
LATENCY_RUNS, LATENCY_SECONDS = 30, 1.0  # batch-1 timings: this many runs, or fewer past this time
THROUGHPUT_RUNS, THROUGHPUT_SECONDS = 5, 1.5
MIN_TIMED_RUNS = 3  # batch-1 runs at least, past the time limit: the measurement is bounded by these (Auto
MIN_BATCH_RUNS = 1  # predicts its cost; on a busy machine three batches of 32 were most of an export's 18 s)


def accuracy(export: LoadedModel, reference: LoadedModel, images: MeasureSet,
             recorded: dict[str, int] | None = None) -> dict:
    """Top-1 of the export and of the checkpoint on `images`, and how often they agree; unreadable files skipped.
    The checkpoint's classes are `recorded` (the run's own evaluation, the file the Results tab reads) when given,
    else the reference's. Multi-label: their mAP, and how often they take the same decision for an image's label at
    its threshold."""
    if reference.multilabel:
        return _multilabel_accuracy(export, reference, images)
    right = reference_right = agree = seen = skipped = 0
    paths = images.samples
    for start in range(0, len(paths), BATCH):
        batch, labels, kept = [], [], []
        for path, label in paths[start:start + BATCH]:
            try:
                batch.append(export.preprocess.decode(path))
                labels.append(label)
                kept.append(path)
            except Exception:  # noqa: BLE001 - a file gone or damaged since training: not counted
                skipped += 1
        if not batch:
            continue
        x, y = torch.stack(batch), torch.tensor(labels)
        got = top_classes(export.logits(x), 1)[:, 0]
        expected = torch.tensor([recorded[p] for p in kept]) if recorded is not None else \
            top_classes(reference.logits(x), 1)[:, 0]
        right += int((got == y).sum())
        reference_right += int((expected == y).sum())
        agree += int((got == expected).sum())
        seen += len(batch)
    if not seen:
        raise ValueError(f"none of the {len(paths)} images of the {images.split} split could be read "
                         f"(listed in {images.source})")
    return {"split": images.split, "images": seen, "of": images.of, "skipped": skipped, "source": images.source,
            "top1": right / seen, "checkpoint_top1": reference_right / seen, "agreement": agree / seen,
            "checkpoint_from": images.source if recorded is not None else "computed for this card (fp32)"}


def _multilabel_accuracy(export: LoadedModel, reference: LoadedModel, images: MeasureSet) -> dict:
    from trainer.deploy.multilabel import mean_average_precision

    got, expected, targets, skipped = [], [], [], 0
    for start in range(0, len(images.samples), BATCH):
        batch, labels = [], []
        for path, label in images.samples[start:start + BATCH]:
            try:
                batch.append(export.preprocess.decode(path))
                labels.append(label)
            except Exception:  # noqa: BLE001 - a file gone or damaged since training: not counted
                skipped += 1
        if batch:
            x = torch.stack(batch)
            got.append(export.logits(x))
            expected.append(reference.logits(x))
            targets.append(torch.tensor(labels, dtype=torch.float32))
    if not got:
        raise ValueError(f"none of the {len(images.samples)} images of the {images.split} split could be read "
                         f"(listed in {images.source})")
    got, expected, y = torch.cat(got), torch.cat(expected), torch.cat(targets)
    on = torch.tensor(reference.thresholds)
    p_got, p_expected = torch.sigmoid(got), torch.sigmoid(expected)
    return {"split": images.split, "images": len(y), "of": images.of, "skipped": skipped, "source": images.source,
            "map": mean_average_precision(got, y)[0], "checkpoint_map": mean_average_precision(expected, y)[0],
            "agreement": float(((p_got >= on) == (p_expected >= on)).float().mean()),
            "max_probability_difference": float((p_got - p_expected).abs().max())}


def readable_images(paths: list[str], decode: Callable[[str], torch.Tensor], limit: int | None = None) -> list:
    """The decoded images of the files that can be read (at most `limit`); the others logged and left out."""
    found = []
    for path in paths:
        try:
            found.append(decode(path))
        except Exception as e:  # noqa: BLE001 - one bad file among a sample is not a reason to stop
            log.warning("%s: skipped (%s)", path, e)
        if limit is not None and len(found) == limit:
            break
    return found


def sample_images(images: MeasureSet | None, frame: Frame, decode: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """LARGE_BATCH uint8 images to time with: the split's first readable ones, else seeded noise."""
    found = readable_images([path for path, _ in images.samples] if images else [], decode, LARGE_BATCH)
    while len(found) < LARGE_BATCH:  # too few images: noise takes as long to classify
        found.append(torch.randint(0, 256, (3, *frame.shape), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(len(found))))
    return torch.stack(found)


WARM_UP = 3, 1  # untimed runs of each model before its timings: at batch 1, at the throughput batch


def speeds(models: dict[str, LoadedModel], images: torch.Tensor, one_at_a_time: bool = False,
           clock: Callable[[], float] = time.perf_counter) -> dict[str, dict]:
    """Each model's median latency of one image and images per second at LARGE_BATCH (one image at a time for the
    formats that take one), timing the network alone on already normalised input, by one harness: the same images,
    batch, warm-up and torch threads for every model, and the models' runs alternated (A B A B ...), so a machine
    that gets busier part-way slows them alike and their ratio holds. Bounded: LATENCY_RUNS (or LATENCY_SECONDS, and
    MIN_TIMED_RUNS at least) rounds at batch 1, THROUGHPUT_RUNS (THROUGHPUT_SECONDS, MIN_BATCH_RUNS) at the batch."""
    batch = 1 if one_at_a_time else LARGE_BATCH
    inputs = {name: m.preprocess.to_input(images) for name, m in models.items()}
    with torch.inference_mode():
        one = _alternated({n: (lambda m=m, x=inputs[n]: m.net(x[:1])) for n, m in models.items()}, WARM_UP[0],
                          LATENCY_RUNS, LATENCY_SECONDS, MIN_TIMED_RUNS, clock)
        many = _alternated({n: (lambda m=m, x=inputs[n]: m.net(x[:batch])) for n, m in models.items()}, WARM_UP[1],
                           THROUGHPUT_RUNS, THROUGHPUT_SECONDS, MIN_BATCH_RUNS, clock) if batch > 1 else one
    harness = {"batch": batch, "warm_up": list(WARM_UP), "threads": torch.get_num_threads(), "alternated": len(models) > 1}
    return {name: {"batch1_ms": 1000 * statistics.median(one[name]), "batch1_runs": len(one[name]), "batch": batch,
                   "batch_ms": 1000 * statistics.median(many[name]),
                   "images_per_s": batch / statistics.median(many[name]), "harness": harness} for name in models}


def _alternated(runs: dict[str, Callable[[], object]], warm_up: int, rounds: int, seconds: float, least: int,
                clock: Callable[[], float]) -> dict[str, list[float]]:
    """Each callable's timings: `warm_up` untimed calls each, then rounds of one timed call each in turn, until
    `rounds`, or past `seconds` once `least` rounds are done."""
    for fn in runs.values():
        for _ in range(warm_up):
            fn()
    out: dict[str, list[float]] = {name: [] for name in runs}
    deadline = clock() + seconds
    done = 0
    while done < rounds and (done < least or clock() < deadline):
        for name, fn in runs.items():
            start = clock()
            fn()
            out[name].append(clock() - start)
        done += 1
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()}"
