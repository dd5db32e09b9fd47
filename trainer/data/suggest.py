"""Settings suggested from what a dataset scan found. Torch-free: the Dataset page shows them (with Apply), and they
are the rule Auto builds on, so the app keeps no copy.

The defaults are tuned for the demo (48 px drawings, 32 px training): 400x300 photos trained at 32 px lose almost
everything that tells them apart, and a horizontal flip turns a 2 into something that is not a digit.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass

import numpy as np
from PIL import Image

from trainer.data.scan import ScanResult, open_image

SIZE_STEP = 32  # suggested sizes are multiples of this (what the torchvision nets downsample by)
MIN_SIZE, MAX_SIZE = 32, 224  # 224: what ImageNet-pretrained weights were trained at; larger costs more than it gains
ASPECT_KEPT = 1.4  # images this much wider than high (or higher than wide) keep their shape: a square crop would cut
# off more than a quarter of each


@dataclass(frozen=True)
class Suggestion:
    key: str  # the config key
    value: object
    why: str


def suggest(scan: ScanResult, current: dict, flips: tuple[bool, str] | None = None) -> list[Suggestion]:
    """What to change in `current` (a config as a dict) for this folder; only the keys whose value would change.
    `flips`: `flip_rule(scan)` where it was measured (it decodes a sample: off the GUI thread), else the names decide."""
    out = []
    data = current.get("data", {})
    if scan.image_sizes:  # each median once: this runs on the GUI thread at every size edit
        short, ratio = median_short_side(scan), median_aspect(scan)
        height, width = shape_for(short, ratio)
        if height != data.get("image_size"):
            tall = ", their width; the height in proportion" if width and ratio < 1 else ""
            out.append(Suggestion("data.image_size", height, f"the images' median short side is {short:.0f} px{tall}"))
        if width != (data.get("image_width") or 0):
            why = (f"the images are {max(ratio, 1 / ratio):.1f} times as {'wide' if ratio > 1 else 'tall'} as they are "
                   f"{'high' if ratio > 1 else 'wide'}: a square crop would cut off {1 - min(ratio, 1 / ratio):.0%} "
                   "of each" if width else "the images are about square")
            out.append(Suggestion("data.image_width", width, why))
    augment = data.get("augment", {})
    if augment.get("hflip") is True:  # auto: the trainer applies the same rule itself
        safe, why = flips or (not looks_like_characters(scan.classes), "the classes look like characters (digits or "
                                                                         "letters): mirrored, they are other symbols")
        if not safe:
            out.append(Suggestion("data.augment.hflip", False, why))
    return out


def suggested_image_size(scan: ScanResult) -> int | None:
    """The images' median short side, rounded down to a multiple of 32, within 32..224 (None without images)."""
    if not scan.image_sizes:
        return None
    return size_for(median_short_side(scan))


def size_for(short: float) -> int:
    """A short side in pixels rounded down to a multiple of 32, within 32..224."""
    return int(max(MIN_SIZE, min(MAX_SIZE, short // SIZE_STEP * SIZE_STEP)))


def suggested_shape(scan: ScanResult) -> tuple[int, int] | None:
    """(data.image_size, data.image_width): the short side at `suggested_image_size`, and where the images' median
    aspect ratio is past ASPECT_KEPT, the long side in proportion (in SIZE_STEP multiples); width 0 = square."""
    return shape_for(median_short_side(scan), median_aspect(scan)) if scan.image_sizes else None


def shape_for(short: float, ratio: float) -> tuple[int, int]:
    """`suggested_shape` of images whose median short side is `short` and median width / height `ratio`."""
    size = size_for(short)
    if 1 / ASPECT_KEPT < ratio < ASPECT_KEPT:
        return size, 0
    long = max(SIZE_STEP, round(size * max(ratio, 1 / ratio) / SIZE_STEP) * SIZE_STEP)
    return (size, long) if ratio > 1 else (long, size)


def median_aspect(scan: ScanResult) -> float:
    """The images' median width / height (worked out once per scan: 100,000 sizes take 35 ms)."""
    if "aspect" not in scan.medians:
        scan.medians["aspect"] = statistics.median(w / h for w, h in scan.image_sizes) if scan.image_sizes else 1.0
    return scan.medians["aspect"]


def median_short_side(scan: ScanResult) -> float:
    """The images' median short side (once per scan, as above)."""
    if "short" not in scan.medians:
        scan.medians["short"] = statistics.median(min(w, h) for w, h in scan.image_sizes)
    return scan.medians["short"]


DIGIT_WORDS = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
SEPARATORS = "_- ."
MIRROR_SIDE = 12  # px: class means are compared at this size, in grey (small: a few pixels of jitter blur away)
MIRROR_SAMPLE = 64  # images per class
MIRROR_MAX_CLASSES = 200
MIRROR_MIN_HALF = 4  # images in each half of a class's sample, at least
MIRROR_STEADY = 0.5  # correlation of a class's two half-sample means (and of a mirrored mean with its match), at least
MIRROR_MARGIN = 0.1  # a mirrored class mean must match another class this much better than its own


def distinct_names(classes: list[str]) -> list[str]:
    """Class names without what they all share at the start and end up to a separator or a letter-to-digit
    boundary (digit_3 -> 3, class-A -> a, 3_digit -> 3); lower case."""
    names = [c.lower() for c in classes]
    if len(names) < 2:
        return names
    prefix = os.path.commonprefix(names)
    while prefix and not (prefix[-1] in SEPARATORS or (prefix[-1].isalpha() and all(
            len(n) > len(prefix) and n[len(prefix)].isdigit() for n in names))):
        prefix = prefix[:-1]
    names = [n[len(prefix):] for n in names]
    suffix = os.path.commonprefix([n[::-1] for n in names])[::-1]
    while suffix and suffix[0] not in SEPARATORS:
        suffix = suffix[1:]
    return [n[: len(n) - len(suffix)] if suffix else n for n in names]


def looks_like_characters(classes: list[str]) -> bool:
    """Every class named by one character (0-9, A-Z, ...) or by a digit word, once what all the names share is set
    aside (digit_3, char-A): writing, which a flip changes."""
    names = distinct_names(classes)
    return len(names) >= 2 and all(len(n) == 1 and n.isalnum() or n in DIGIT_WORDS for n in names)


MIRROR_WORDS = (("left", "right"), ("l", "r"), ("cw", "ccw"), ("clockwise", "anticlockwise"),
                ("clockwise", "counterclockwise"))


def mirror_named(classes: list[str]) -> list[tuple[str, str]]:
    """(class, other) whose names differ only by a word a mirror swaps (turn_left and turn_right, left_hand and
    right_hand, cw and ccw): a flip would show one as the other, whatever the images look like."""
    pairs = []
    names = {c.lower(): c for c in classes}
    for lower, name in names.items():
        words = re.split(r"([_\- .])", lower)
        for a, b in MIRROR_WORDS:
            swapped = "".join(b if w == a else a if w == b else w for w in words)
            if swapped != lower and swapped in names and (names[swapped], name) not in pairs:
                pairs.append((name, names[swapped]))
    return pairs


def mirror_confusions(scan: ScanResult) -> list[tuple[str, str]]:
    """(class, other) where the class's mirrored mean image matches another class's mean better than its own (b and
    d, p and q, arrows left and right): measured on a sample of the images, not their names. Means are compared as
    deviations from the mean of all classes, and only classes whose mean is reproducible (two halves of the sample
    agree) take part: photographs and objects placed anywhere have no telling mean, and are never flagged."""
    if not 2 <= len(scan.classes) <= MIRROR_MAX_CLASSES or scan.labels_file:  # multi-label: no one class's mean
        return []
    by_class: dict[int, list[str]] = {}
    for path, label in scan.samples:
        if len(by_class.setdefault(label, [])) < MIRROR_SAMPLE:
            by_class[label].append(path)
    halves = {}
    for label, paths in by_class.items():
        images = [image for image in map(_grey, paths) if image is not None]
        if len(images) >= 2 * MIRROR_MIN_HALF:
            halves[label] = (np.mean(images[::2], axis=0), np.mean(images[1::2], axis=0))
    if len(halves) < 2:
        return []
    labels = sorted(halves)
    overall = np.mean([a + b for a, b in halves.values()], axis=0) / 2
    means = {k: (a + b) / 2 - overall for k, (a, b) in halves.items()}
    steady = [k for k in labels if float(_unit(halves[k][0] - overall).ravel() @ _unit(halves[k][1] - overall).ravel())
              >= MIRROR_STEADY]
    out = []
    for k in steady:
        mirrored = _unit(means[k][:, ::-1] + overall[:, ::-1] - overall).ravel()
        scores = {j: float(mirrored @ _unit(means[j]).ravel()) for j in steady}
        best = max((j for j in steady if j != k), key=scores.get, default=None)
        if best is not None and scores[best] >= MIRROR_STEADY and scores[best] > scores[k] + MIRROR_MARGIN:
            out.append((scan.classes[k], scan.classes[best]))
    return out


MULTILABEL_CROP_MIN = 0.8  # a smaller crop can cut a labelled thing out of the image, and its label with it
GLYPH_CROP_MIN = 0.8  # characters: a smaller crop cuts strokes off, and what is left can be another symbol
# (bench/augment_auto.py, digits: crops from 60% a point under no crop over six seeds; from 80% 95.8% median, no crop
# 93.5%, crops from 60% with flips 88.4%)
CROP_MIN = 0.6  # single-label: RandomResizedCrop's spirit, kept from the earlier fixed default


def resolve_augment(augment, scan) -> list[dict]:
    """`data.augment`'s auto values decided for this data, in place; what was decided and why, one
    {"key", "value", "why"} each (nothing for a value the config set). `scan`: the classes, the training samples and
    whether the run is multi-label (`labels_file`), as a ScanResult has them."""
    decided = []
    if augment.hflip == "auto":
        augment.hflip, why = flip_rule(scan)  # multi-label: the label names decide (digits, letters)
        decided.append({"key": "data.augment.hflip", "value": augment.hflip, "why": why})
    if augment.crop_scale_min == "auto":
        glyphs = looks_like_characters(scan.classes)
        augment.crop_scale_min = MULTILABEL_CROP_MIN if scan.labels_file else GLYPH_CROP_MIN if glyphs else CROP_MIN
        why = ("multi-label: a smaller crop can cut a labelled thing out of the image, and its label with it"
               if scan.labels_file else "the classes look like characters: a smaller crop cuts strokes off, and what "
               "is left can be another symbol" if glyphs else "the usual smallest crop for one class an image")
        decided.append({"key": "data.augment.crop_scale_min", "value": augment.crop_scale_min, "why": why})
    return decided


def flip_rule(scan: ScanResult) -> tuple[bool, str]:
    """Whether mirror images keep their class (horizontal flips in training, flip test-time augmentation), and why."""
    if looks_like_characters(scan.classes):
        return False, "the classes look like characters (digits or letters): mirrored, they are other symbols"
    named = mirror_named(scan.classes)
    if named:
        return False, "mirrored, " + ", ".join(f"{a} would be {b}" for a, b in named[:3]) + " (the class names)"
    confused = mirror_confusions(scan)
    if confused:
        pairs = ", ".join(f"{a} -> {b}" for a, b in confused[:3]) + (" ..." if len(confused) > 3 else "")
        return False, f"mirrored, some classes look like others in these images ({pairs})"
    return True, "mirror images look like the same class (names and a sample of the images checked)"


def _grey(path: str) -> np.ndarray | None:
    try:
        with open_image(path) as image:
            return np.asarray(image.convert("L").resize((MIRROR_SIDE, MIRROR_SIDE)), dtype=np.float32)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


def _unit(image: np.ndarray) -> np.ndarray:
    centred = image - image.mean()
    norm = float(np.linalg.norm(centred))
    return centred / norm if norm else centred
