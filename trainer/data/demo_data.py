"""The built-in demo dataset: procedurally drawn shapes that a small network learns in about a minute.

Torch-free (Pillow and numpy). Each class is a shape drawn in a random colour, size, position and
rotation over a random background with noise, so the task needs real (if easy) learning.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from trainer.core.system import user_dir

CLASSES = ("circle", "square", "triangle", "cross")


def _random_colour(rng: np.random.Generator, low: int, high: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(low, high, 3))


def draw_shape(shape: str, size: int, rng: np.random.Generator) -> Image.Image:
    # Dark backgrounds, bright shapes: varied colours, but a contrast a small network learns quickly.
    background = _random_colour(rng, 0, 110)
    img = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(img)
    colour = _random_colour(rng, 150, 256)
    radius = size * rng.uniform(0.18, 0.36)
    cx, cy = (rng.uniform(radius + 1, size - radius - 1) for _ in range(2))
    angle = rng.uniform(0, 2 * math.pi)

    def polygon(n: int, r: float, phase: float) -> list[tuple[float, float]]:
        return [(cx + r * math.cos(phase + 2 * math.pi * k / n), cy + r * math.sin(phase + 2 * math.pi * k / n))
                for k in range(n)]

    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    elif shape == "square":
        draw.polygon(polygon(4, radius * 1.2, angle), fill=colour)
    elif shape == "triangle":
        draw.polygon(polygon(3, radius * 1.25, angle), fill=colour)
    elif shape == "cross":
        w = radius * 0.35
        for a in (angle, angle + math.pi / 2):
            dx, dy = math.cos(a), math.sin(a)
            px, py = -dy * w, dx * w
            draw.polygon([(cx - dx * radius + px, cy - dy * radius + py), (cx + dx * radius + px, cy + dy * radius + py),
                          (cx + dx * radius - px, cy + dy * radius - py), (cx - dx * radius - px, cy - dy * radius - py)],
                         fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(CLASSES)}")
    pixels = np.asarray(img, dtype=np.int16) + rng.normal(0, 12, (size, size, 3)).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def write_demo_dataset(root: str | os.PathLike, per_class: int = 250, size: int = 48, seed: int = 0,
                       classes: tuple[str, ...] = CLASSES) -> Path:
    """Write `per_class` PNG images per shape class under root/<class>/ and return root."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for name in classes:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw_shape(name, size, rng).save(folder / f"{name}_{i:04d}.png")
    return root


def demo_dataset_dir() -> Path:
    """Where the app keeps its demo dataset: the user's data folder (on Linux $XDG_DATA_HOME/traindeck, by default
    ~/.local/share/traindeck), never the project's folder."""
    return user_dir("data") / "demo_data"


def ensure_demo_dataset(root: str | os.PathLike) -> Path:
    """The demo dataset at root, written on first use."""
    root = Path(root)
    marker = root / ".complete"
    if not marker.exists():
        write_demo_dataset(root)
        marker.write_text("traindeck demo dataset\n")
    return root
