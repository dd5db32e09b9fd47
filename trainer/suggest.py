"""Settings suggested from what a dataset scan found. Torch-free: the Dataset page shows them (with Apply), and they
are the rule Auto builds on, so the app keeps no copy.

The defaults are tuned for the demo (48 px drawings, 32 px training): 400x300 photos trained at 32 px lose almost
everything that tells them apart, and a horizontal flip turns a 2 into something that is not a digit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trainer.scan import ScanResult

SIZE_STEP = 32  # suggested sizes are multiples of this (what the torchvision nets downsample by)
MIN_SIZE, MAX_SIZE = 32, 224  # 224: what ImageNet-pretrained weights were trained at; larger costs more than it gains


@dataclass(frozen=True)
class Suggestion:
    key: str  # the config key
    value: object
    why: str


def suggest(scan: ScanResult, current: dict) -> list[Suggestion]:
    """What to change in `current` (a config as a dict) for this folder; only the keys whose value would change."""
    out = []
    size = suggested_image_size(scan)
    data = current.get("data", {})
    if size is not None and size != data.get("image_size"):
        out.append(Suggestion("data.image_size", size, f"the images' median short side is {median_short_side(scan):.0f} px"))
    augment = data.get("augment", {})
    if augment.get("hflip", True) and looks_like_characters(scan.classes):
        out.append(Suggestion("data.augment.hflip", False, "the classes look like characters (digits or letters): "
                                                           "mirrored, they are other symbols"))
    return out


def suggested_image_size(scan: ScanResult) -> int | None:
    """The images' median short side, rounded down to a multiple of 32, within 32..224 (None without images)."""
    if not scan.image_sizes:
        return None
    return int(max(MIN_SIZE, min(MAX_SIZE, median_short_side(scan) // SIZE_STEP * SIZE_STEP)))


def median_short_side(scan: ScanResult) -> float:
    return statistics.median(min(w, h) for w, h in scan.image_sizes)


def looks_like_characters(classes: list[str]) -> bool:
    """Every class named by one character (0-9, A-Z, ...) or by a digit word: writing, which a flip changes."""
    digits = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
    return len(classes) >= 2 and all(len(c) == 1 and c.isalnum() or c.lower() in digits for c in classes)
