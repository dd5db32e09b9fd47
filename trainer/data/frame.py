"""The network's input frame: height x width in pixels, and how an image of another shape is fitted to it.

One record for every path that turns a file into the network's input (training, validation, the cache, predict,
exports and their model cards), so they all decode alike. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FITS = {"crop": "short side to fit, centre crop", "pad": "whole image, long side to fit, centred on black"}


@dataclass(frozen=True)
class Frame:
    height: int
    width: int
    fit: str = "crop"  # a key of FITS

    @classmethod
    def of(cls, data: Any) -> Frame:
        """The frame a run's `data` config asks for (data.image_size, data.image_width, data.resize), given as the
        DataConfig or as its dict (a checkpoint's config; older ones lack the last two)."""
        get = data.get if isinstance(data, dict) else lambda key, default=None: getattr(data, key, default)
        return cls(int(get("image_size")), int(get("image_width") or get("image_size")), get("resize") or "crop")

    @classmethod
    def from_record(cls, record: dict) -> Frame:
        """From a checkpoint's or export's preprocessing record (`to_record`; older ones hold image_size alone)."""
        size = int(record["image_size"])
        return cls(size, int(record.get("image_width") or size), record.get("fit", "crop"))

    def to_record(self) -> dict:
        return {"image_size": self.height, "image_width": self.width, "fit": self.fit,
                "resize": FITS[self.fit]}

    @property
    def shape(self) -> tuple[int, int]:
        return self.height, self.width

    @property
    def pixels(self) -> int:
        return self.height * self.width

    def scaled(self, height: int) -> Frame:
        """The same shape at another height (progressive resizing), the width in proportion."""
        return Frame(height, max(1, round(self.width * height / self.height)), self.fit)

    def __str__(self) -> str:
        """As people read an image's size: width x height (a 96 x 48 px frame is 96 wide, 48 high)."""
        return f"{self.width} x {self.height} px"
