"""The images an export is measured and calibrated on, found from what the run itself recorded.

Measured on: the run's test set (`RUN_DIR/eval/test`, from data.test_dir or data.test_split) when it has one, else
its validation split (`RUN_DIR/eval/val`, written by the trainer at its best epoch): the exact images and labels
the run's own evaluation used, so the export's top-1 is comparable with the run's. Calibrated on: a seeded sample
of the run's training split (its training folder less those validation and test images), or a folder the user
gives. Nothing here writes: the dataset is only read.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from trainer.core.errors import InputError
from trainer.core.predictions import read_predictions
from trainer.core.rundir import RunDir, read_run_json
from trainer.data.scan import image_paths

MEASURE_IMAGES = 2000  # at most this many images of the split are measured (a seeded sample beyond that)
SPLITS = ("test", "val")  # in the order preferred


class CalibrationError(InputError, ValueError):
    pass


@dataclass
class MeasureSet:
    split: str  # test | val
    samples: list[tuple[str, int]]  # (path, label; multi-label a 0/1 tuple), at most MEASURE_IMAGES
    of: int  # images in the split
    source: str  # the predictions file they come from
    recorded: dict[str, int] | None = None  # single-label: each image's class as that file records the checkpoint's
    epoch: int | None = None  # the checkpoint epoch that file was written with (its metrics.json)

    def recorded_for(self, epoch: int) -> dict[str, int] | None:
        """The checkpoint's recorded classes when the file was written with the checkpoint of `epoch`: what the
        Results tab shows, so the card's checkpoint figures are the same numbers (issue #69)."""
        return self.recorded if self.recorded is not None and self.epoch == epoch else None

    def describe(self) -> str:
        part = f"{len(self.samples)} of {self.of}" if len(self.samples) < self.of else str(self.of)
        return f"{self.split} split, {part} images"


def measure_set(run: RunDir, classes: list[str], seed: int = 0) -> tuple[MeasureSet | None, str]:
    """The images to measure an export on, or None and why there are none."""
    label = {name: i for i, name in enumerate(classes)}
    for split in SPLITS:
        path = run.evaluation(split) / "predictions.csv"
        if not path.exists():
            continue
        recorded = None
        try:
            rows = read_predictions(path)
            if rows and rows[0].probabilities:  # multi-label: the image's labels as a 0/1 tuple
                samples = [(r.path, tuple(float(n in r.true) for n in classes)) for r in rows]
            else:
                samples = [(r.path, label[r.true[0]]) for r in rows]
                recorded = {r.path: label[r.predicted[0]] for r in rows}
        except (OSError, KeyError, ValueError, IndexError) as e:
            return None, f"{path}: unreadable ({e})"
        chosen = sorted(random.Random(seed).sample(samples, MEASURE_IMAGES)) if len(samples) > MEASURE_IMAGES \
            else samples
        return MeasureSet(split, chosen, len(samples), str(path), recorded, _written_at(path.parent)), ""
    return None, (f"{run.path / 'eval'}: the run has no evaluated split (val/predictions.csv is written by the trainer "
                  "at its best epoch)")


def _written_at(folder: Path) -> int | None:
    """The checkpoint epoch an evaluation folder's metrics.json says it was written with (None: not said, or the
    file unreadable, in which case the card computes the checkpoint's figures itself)."""
    try:
        epoch = read_run_json(folder / "metrics.json", "an evaluation's metrics.json").get("epoch")
    except (OSError, ValueError, AttributeError):
        return None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def calibration_images(run: RunDir, config: dict, folder: Path | None, count: int, seed: int) -> tuple[list[str], str]:
    """(paths, where they come from): `count` images chosen with `seed` from `folder`, or from the run's training
    split. CalibrationError naming the folder when there are none."""
    if count < 1:
        raise CalibrationError(f"--calibration-images: must be at least 1, got {count}")
    if folder is not None:
        if not folder.is_dir():
            raise CalibrationError(f"--calibration: {folder}: no such folder")
        pool = image_paths(folder)
        if not pool:
            raise CalibrationError(f"--calibration: {folder}: no images in it (looked for .jpg, .png, .webp, ... "
                                   "at any depth)")
        where = str(folder)
    else:
        train_dir = config["data"]["train_dir"]
        if not os.path.isdir(train_dir):
            raise CalibrationError(f"data.train_dir: {train_dir}: the run's training folder is gone; give images to "
                                   "calibrate on with --calibration FOLDER")
        held_out = set()
        for split in SPLITS:
            path = run.evaluation(split) / "predictions.csv"
            if path.exists():
                held_out |= {r.path for r in read_predictions(path)}
        pool = [p for p in image_paths(train_dir) if p not in held_out]
        if not pool:
            raise CalibrationError(f"data.train_dir: {train_dir}: no training images left to calibrate on; give "
                                   "images with --calibration FOLDER")
        where = f"the run's training split ({train_dir})"
    chosen = sorted(random.Random(seed).sample(pool, min(count, len(pool))))
    return chosen, f"{len(chosen)} images chosen with seed {seed} from {where}"
